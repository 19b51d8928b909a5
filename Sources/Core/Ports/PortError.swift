#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Why a port could not take a message.
public enum PortError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The receiver had no room until the send's deadline (a `LocalPort`'s
    /// queue, a `RemotePort`'s socket buffer): the receiving loop is not
    /// taking messages as fast as they come, or not running in one of the
    /// port's modes. Nothing was queued. For `RemotePort.lookup` and
    /// `RemotePort.connect`: the owner did not accept the connection in
    /// time. `after` is how long the call waited.
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
    /// A `NamedPort` of this name is published already (by this process or
    /// another of the same network namespace). `owner` is the process that
    /// holds the name, as the kernel reports it (`SO_PEERCRED`) on a probe
    /// connection to the name; nil when the probe could not connect (the
    /// owner's backlog was full, or it let go of the name meanwhile).
    ///
    /// The probe is an ordinary connection that closes at once: the owner
    /// accepts it, or counts it as refused if it does not admit this
    /// process's user, and sends it nothing else.
    case nameTaken(String, owner: PortOwner? = nil)
    /// No process publishes a `NamedPort` of this name (it never did, or its
    /// owner invalidated the port or died, which frees the name).
    case nameNotFound(String)
    /// A `NetworkPort` could not listen at `host`:`port`: another socket is
    /// bound to that address (`EADDRINUSE`).
    case addressInUse(host: String, port: UInt16)
    /// TCP could not connect to `host`:`port` (`RemotePort.connect`, or
    /// its reconnection in a forked child); `code` is the errno: say,
    /// `ECONNREFUSED` (nothing listens on that port), `ETIMEDOUT` (the
    /// kernel gave up before the call's own timeout), `EHOSTUNREACH` or
    /// `ENETUNREACH` (no route to the host). The call's own timeout is
    /// `.timedOut`.
    case connectionFailed(host: String, port: UInt16, code: Int32)
    /// The process that publishes the name runs as user `uid`, not the one
    /// expected: someone else took the name, and nothing was sent to it.
    case foreignOwner(name: String, uid: UInt32)
    /// The port's owner refused this process: it runs as a user the port
    /// does not accept (`NamedPort.Access`).
    case accessDenied(String)
    /// The receiving process closed the connection or died; the message was
    /// not delivered (or, for a request, not answered).
    case peerGone
    /// A request was sent but no reply came within the reply timeout.
    case replyTimedOut(after: Duration)
    /// The envelope holds something that cannot cross a process boundary:
    /// a `LocalPort` (as a component or reply port), which lives in one
    /// process. Send a `RemotePort` (a send right to a `NamedPort`) instead.
    case notTransferable(String)
    /// The envelope holds something Foundation's `SocketPort` wire format
    /// (`PortWireFormat.foundationSocketPort`) cannot carry: a port (as a
    /// component or reply port), or a request, which needs a reply on the
    /// same connection. Nothing was sent.
    case unsupportedByFoundationWireFormat(String)
    /// The peer sent bytes that are not a well-formed port message; the
    /// connection was closed.
    case malformed(String)
    /// The peer sent part of a frame and then nothing for longer than the
    /// port's stall limit (`NetworkPort.stallLimit`); the connection was
    /// closed.
    case frameStalled(after: Duration)
    /// The kernel refused a call the port needed (out of descriptors or
    /// memory, say).
    case system(SystemCallError)
    /// A send to a `LocalPort` whose queue is full (`capacity` messages),
    /// from the thread of the very loop that receives the port (its handler,
    /// say): only that thread makes room, so waiting would wait for itself.
    /// Refused at once; nothing was queued.
    case fullQueueOnItsOwnLoop(capacity: Int)
    /// A `RemotePort` used in a child process that inherited it through
    /// `fork()`, with no address to make a connection of its own (it was
    /// received in a message, or made by `NamedPort.makeSendRight()`): the
    /// parent's connection is not shared, or replies would go to the wrong
    /// process. `name` is the port's name, if any. Nothing was sent. Look
    /// the port up by name in the child, or have a send right sent to the
    /// child after the fork.
    case inheritedAcrossFork(String?)
    /// A requester left `limit` bytes of replies or more unread
    /// (`NetworkPort.replyBacklogLimit`); at its next reply, `bytes` in all
    /// would have waited, so the port closed the connection.
    case replyBacklogExceeded(bytes: Int, limit: Int)
    /// Partial frames (frames still arriving) held `totalBytes` across a
    /// `NetworkPort`'s connections, over its `partialFrameMemoryLimit`;
    /// this connection, holding `connectionBytes` of them, was among the
    /// largest and was closed.
    case partialFramesOverLimit(connectionBytes: Int, totalBytes: Int, limit: Int)

    public var description: String {
        switch self {
        case .timedOut(let waited):
            "timed out after \(waited): the port's queue stayed full, or (connecting, looking up) the port did not accept the connection; the message was not sent"
        case .invalidated:
            "the port is invalidated; it takes no more messages"
        case .messageTooLarge(let bytes, let limit):
            "the message carries \(bytes) bytes, over the limit of \(limit) (PortEnvelope.maximumByteCount)"
        case .tooManyComponents(let count, let limit):
            "the message has \(count) components, over the limit of \(limit) (PortEnvelope.maximumComponentCount)"
        case .nameTaken(let name, let owner?):
            "a port named \"\(name)\" is published already, by \(owner)"
        case .nameTaken(let name, nil):
            "a port named \"\(name)\" is published already; by whom is unknown (a probe connection to its owner did not connect)"
        case .nameNotFound(let name):
            "no process publishes a port named \"\(name)\""
        case .addressInUse(let host, let port):
            "cannot listen at \(host):\(port): the address is in use (EADDRINUSE), another socket is bound to it"
        case .connectionFailed(let host, let port, let code):
            "cannot connect to \(host):\(port) over TCP: \(errnoDescription(code))\(Self.connectHint(code))"
        case .foreignOwner(let name, let uid):
            "the port named \"\(name)\" is published by user \(uid), not the expected owner; nothing was sent"
        case .accessDenied(let name):
            "the owner of the port named \"\(name)\" does not accept this process's user"
        case .peerGone:
            "the receiving process closed the connection or exited"
        case .replyTimedOut(let waited):
            "no reply within \(waited)"
        case .notTransferable(let what):
            "\(what) cannot cross a process boundary"
        case .unsupportedByFoundationWireFormat(let what):
            "Foundation's SocketPort wire format cannot carry \(what); nothing was sent"
        case .malformed(let why):
            "malformed port message: \(why)"
        case .frameStalled(let limit):
            "a frame stalled: part of it arrived, then nothing for longer than \(limit); the connection was closed"
        case .system(let error):
            error.description
        case .partialFramesOverLimit(let mine, let total, let limit):
            "partial frames held \(total) bytes across the port's connections, over its limit of \(limit) (partialFrameMemoryLimit); this connection held \(mine) of them, among the most, and was closed"
        case .replyBacklogExceeded(let bytes, let limit):
            "the requester did not read its replies: \(bytes) bytes would wait, past the port's limit of \(limit) (replyBacklogLimit); the connection was closed"
        case .inheritedAcrossFork(let name):
            "this RemotePort\(name.map { " (\"\($0)\")" } ?? "") was inherited through fork() and has no name or address to reconnect by (it came in a message or from makeSendRight()); its connection stays the parent's, so the child cannot use it: look the port up by name in the child (RemotePort.lookup), or have a send right sent to the child after the fork; nothing was sent"
        case .fullQueueOnItsOwnLoop(let capacity):
            "the LocalPort's queue is full (\(capacity) messages) and the send comes from the thread of the loop that receives it, the only thread that makes room: waiting would deadlock, so it is refused; nothing was queued"
        }
    }

    /// What a TCP connect's errno says about the other end.
    private static func connectHint(_ code: Int32) -> String {
        switch code {
        case ECONNREFUSED: "; nothing listens on that port"
        case ETIMEDOUT: "; the host did not answer"
        case EHOSTUNREACH, ENETUNREACH: "; there is no route to the host"
        case EADDRNOTAVAIL: "; no local address or port was free to connect from"
        default: ""
        }
    }
}

/// The process that holds a `NamedPort`'s name, as the kernel reports it
/// (`SO_PEERCRED`): the user and process that made the owner's listening
/// socket.
public struct PortOwner: Sendable, Hashable, CustomStringConvertible {
    /// The owner's effective user id.
    public let uid: UInt32
    /// The owner's process id, in this process's PID namespace; nil if the
    /// owner lives in a PID namespace this process cannot see into.
    public let pid: Int32?

    /// An owner of user `uid` and process `pid`.
    public init(uid: UInt32, pid: Int32?) {
        self.uid = uid
        self.pid = pid
    }

    public var description: String {
        "user \(uid), process \(pid.map(String.init) ?? "unknown (outside this PID namespace)")"
    }
}
