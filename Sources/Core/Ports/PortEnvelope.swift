/// A message for a port: an identifier chosen by the sender, a list of
/// components (byte buffers and ports), and optionally a port to answer on.
/// It is what the guide calls a port message and does the job of
/// Foundation's `PortMessage`, whose name Spindle leaves to Foundation.
///
///     let reply = LocalPort { answer in print(answer.id) }
///     ThreadLoop.current.add(reply)
///     let ask = PortEnvelope(id: 7, components: [.bytes(Array("ping".utf8))], replyPort: reply)
///     try server.send(ask, timeout: .milliseconds(100))
///
/// An envelope is an immutable value and `Sendable`: any thread may build,
/// send or keep one. Its byte buffers are arrays, which are references to
/// their storage: a `LocalPort` hands the receiver the very buffers the
/// sender put in, with no copy (a buffer is copied only if someone later
/// mutates their own array, as for any Swift array).
///
/// ## Size
///
/// An envelope may hold at most `maximumComponentCount` components and
/// `maximumByteCount` bytes across its byte buffers. Sending a larger one
/// throws `PortError.messageTooLarge` or `PortError.tooManyComponents`
/// before anything is queued. Every kind of port applies the same limits,
/// so a message that one port accepts can be forwarded through another.
///
/// ## On the receiving side
///
/// The handler of a receiving `LocalPort` gets the envelope with
/// `receivePort` set to that port. `replyPort` is the port the sender asked
/// to be answered on (Cocoa reads it as the incoming message's "send
/// port"): the guide's check-in message carries the worker's own port there.
///
/// Across processes (`RemotePort`, `NamedPort`) only bytes and
/// `.remotePort` components travel: a `LocalPort` cannot leave its process
/// (`PortError.notTransferable`), so a message to another process has no
/// `replyPort` and arrives with no `receivePort`; answer a request by
/// returning the reply from the `NamedPort`'s handler, or pass a send right
/// as a component.
public struct PortEnvelope: Sendable {
    /// One part of a message.
    public enum Component: Sendable {
        /// A byte buffer, passed by reference to its storage (no copy
        /// in-process).
        case bytes([UInt8])
        /// A port the receiver can send to: in-process, the object itself.
        case port(LocalPort)
        /// A send right to a `NamedPort`, possibly in another process; it
        /// crosses a process boundary as a descriptor (`SCM_RIGHTS`) and
        /// arrives as a usable `RemotePort`.
        case remotePort(RemotePort)

        /// The bytes of a `.bytes` component; nil for a port.
        public var bytes: [UInt8]? {
            if case .bytes(let b) = self { return b }
            return nil
        }

        /// The port of a `.port` component; nil otherwise.
        public var port: LocalPort? {
            if case .port(let p) = self { return p }
            return nil
        }

        /// The send right of a `.remotePort` component; nil otherwise.
        public var remotePort: RemotePort? {
            if case .remotePort(let p) = self { return p }
            return nil
        }
    }

    /// The most bytes an envelope may carry across its byte buffers: 16 MiB.
    /// Above the 1 MiB messages the throughput benchmarks send, with room;
    /// low enough that a length read from another process cannot make a
    /// receiver allocate without bound.
    public static let maximumByteCount = 16 << 20

    /// The most components an envelope may carry: 256, enough for any
    /// message built by hand, low enough that a component table read from
    /// another process stays small. Across processes a further limit
    /// applies: each `.remotePort` component, and each byte buffer sent
    /// outside the record (in a memfd), is a descriptor, and the kernel
    /// passes at most 253 in one message (`SCM_MAX_FD`); more throw
    /// `PortError.tooManyComponents` with that limit.
    public static let maximumComponentCount = 256

    /// The sender's identifier for the kind of message (the guide's check-in
    /// message uses 100). Default 0.
    public let id: UInt32
    /// The parts of the message, in the order the sender gave them.
    public let components: [Component]
    /// The port the receiver should answer on, if any.
    public let replyPort: LocalPort?
    /// The port the message arrived on: set for an envelope handed to a
    /// port's handler, nil for one the caller built.
    public internal(set) var receivePort: LocalPort?

    /// A message with identifier `id`, `components` and an optional port to
    /// reply on. Never blocks; the limits are checked when it is sent.
    public init(id: UInt32 = 0, components: [Component] = [], replyPort: LocalPort? = nil) {
        self.id = id
        self.components = components
        self.replyPort = replyPort
        self.receivePort = nil
    }

    /// The bytes across the envelope's byte buffers.
    public var byteCount: Int {
        var total = 0
        for c in components {
            if case .bytes(let b) = c { total += b.count }
        }
        return total
    }

    /// Throws if the envelope is over either limit.
    func checkLimits() throws(PortError) {
        guard components.count <= Self.maximumComponentCount else {
            throw .tooManyComponents(count: components.count, limit: Self.maximumComponentCount)
        }
        let bytes = byteCount
        guard bytes <= Self.maximumByteCount else {
            throw .messageTooLarge(byteCount: bytes, limit: Self.maximumByteCount)
        }
    }
}
