import CShims

/// Readiness of a file descriptor.
public struct Readiness: OptionSet, Sendable, Hashable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// Data can be read (or a peer closed, or a listening socket has a connection).
    public static let readable = Readiness(rawValue: CSHIMS_EVENT_READABLE)
    /// A write would not block.
    public static let writable = Readiness(rawValue: CSHIMS_EVENT_WRITABLE)
    /// Reported, never requested: an error condition on the descriptor.
    public static let error = Readiness(rawValue: CSHIMS_EVENT_ERROR)
    /// Reported, never requested: the peer hung up.
    public static let hangup = Readiness(rawValue: CSHIMS_EVENT_HANGUP)
}
