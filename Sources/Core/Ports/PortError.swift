/// Why a port could not take a message.
public enum PortError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The receiver's queue stayed full until the send's deadline: the
    /// receiving loop is not taking messages as fast as they come (or not
    /// running in one of the port's modes). Nothing was queued.
    case timedOut(after: Duration)
    /// The port was invalidated (by `invalidate()`, or because the thread
    /// whose loop received it exited) before or while the send waited.
    /// Nothing was queued.
    case invalidated
    /// The envelope carries more bytes than `PortEnvelope.maximumByteCount`.
    case messageTooLarge(byteCount: Int, limit: Int)
    /// The envelope has more components than
    /// `PortEnvelope.maximumComponentCount`.
    case tooManyComponents(count: Int, limit: Int)

    public var description: String {
        switch self {
        case .timedOut(let waited):
            "the port's queue stayed full for \(waited); the message was not sent"
        case .invalidated:
            "the port is invalidated; it takes no more messages"
        case .messageTooLarge(let bytes, let limit):
            "the message carries \(bytes) bytes, over the limit of \(limit) (PortEnvelope.maximumByteCount)"
        case .tooManyComponents(let count, let limit):
            "the message has \(count) components, over the limit of \(limit) (PortEnvelope.maximumComponentCount)"
        }
    }
}
