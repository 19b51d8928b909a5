/// A send right to a `NamedPort`, possibly in another process: what the
/// guide's remote message port is (a remote `MessagePort`, or
/// `SocketPort(remoteWithTCPPort:host:)`). Get one by name (`lookup`), or
/// receive one in a message (a `.remotePort` component), or make one from a
/// port of your own (`NamedPort.makeSendRight()`) to put in a message.
///
///     let server = try RemotePort.lookup("com.example.indexer")
///     try server.send(PortEnvelope(id: 1, components: [.bytes(Array("reindex".utf8))]), timeout: .milliseconds(100))
///     let answer = try server.sendRequest(PortEnvelope(id: 2), timeout: .milliseconds(100), replyTimeout: .seconds(1))
///
/// Underneath it is one connected socket to the port's owner: an `AF_UNIX`
/// sequenced-packet socket for a `NamedPort`, a TCP stream of frames for a
/// `NetworkPort` (`connect(host:port:wireFormat:timeout:)`), in Spindle's
/// framing or in that of Foundation's `SocketPort` (which also reaches a
/// Foundation program's `SocketPort`: see `PortWireFormat`); messages on
/// it arrive in the order sent, each whole.
///
/// ## Large buffers
///
/// To a `NamedPort`, a byte buffer of 16 KiB to 2 MiB (or one beyond what
/// the record holds inline) goes through a shared-memory ring that the port
/// makes in this process with its first such buffer: a 4 MiB sealed memfd,
/// mapped here and by the owner, passed once. Sends that use it go one at a
/// time, so that buffers reach the owner in ring order. When the owner has
/// not yet copied out enough to make room, the buffer goes in a sealed
/// memfd of its own instead: a send never waits for the ring. The ring's
/// memory stays while the port lives. A child process that sends on a port
/// it inherited through `fork()` makes a ring of its own. The owner's
/// replies come back the same way, through a ring it makes for the
/// connection (`sharedMemoryReplyBuffers` counts those buffers).
///
/// ## Blocking
///
/// `send` waits (in `ppoll`) for room in the socket buffer at most its
/// timeout; `sendRequest` then waits for the reply at most its reply
/// timeout. Neither involves the caller's run loop. Requests on one
/// `RemotePort` go one at a time (a second waits for the first to finish);
/// one-way sends from several threads may overlap.
///
/// ## Failures
///
/// Each failure is a specific `PortError`: `.peerGone` once the owner
/// closed the connection or died (the port stays usable for nothing after
/// that: invalidate it); `.timedOut` when the owner does not read;
/// `.replyTimedOut`; `.notTransferable` for an envelope holding a
/// `LocalPort`; `.invalidated` after `invalidate()`.
///
/// Thread-safe; `Sendable`. Misuse (an empty, too long or NUL-holding
/// name, a negative timeout) stops the process with a message.
public final class RemotePort: @unchecked Sendable {
    // @unchecked: `state` is guarded by `lock`; request state by
    // `requestLock`; `name` is immutable.

    /// The name it was looked up by; nil for a port received in a message
    /// or made by `NamedPort.makeSendRight()`.
    public let name: String?

    /// A Unix-domain sequenced-packet socket (records, descriptors), or a
    /// TCP stream (frames, bytes only) in Spindle's framing or in
    /// Foundation's, whose every frame names its destination by `signature`.
    enum Transport: Equatable {
        case local
        case stream
        case foundationStream(signature: [UInt8])
    }

    private let transport: Transport
    private let lock = Lock()
    private var state: State
    /// Held while a frame is written to a stream, so that frames from
    /// several threads do not interleave.
    private let writeLock = Lock()
    /// Reply frames read from a stream and not yet taken. Guarded by
    /// `requestLock`.
    private var replyFrames = PortWire.FrameReader()
    /// Held for the whole of a request, so that its reply is read by its
    /// requester; guards `nextSequence` and `replyBuffer`.
    private let requestLock = Lock()
    private var nextSequence: UInt64 = 1
    private var replyBuffer: UnsafeMutableRawBufferPointer?
    /// This process's ring for buffers too large to go inline, made with
    /// the first such message (`PortSendRing`; a named port's only).
    private let sendRing = PortSendRing()
    /// The owner's ring for large buffers in its replies, once it sent one.
    /// Guarded by `requestLock`.
    private let replyRings = PortReceiveRings()
    private var replyRingBuffers = 0

    private struct State {
        var fd: Int32
        var valid = true
        /// Calls using `fd` right now; the last one out closes it once the
        /// port is invalid.
        var users = 0
    }

    /// A port over `fd`, which it now owns (closes when invalidated or
    /// deinitialized).
    init(adopting fd: Int32, name: String?, transport: Transport = .local) {
        state = State(fd: fd)
        self.name = name
        self.transport = transport
    }

    deinit {
        if state.fd >= 0 { PortSocketCalls.close(state.fd) }
        replyBuffer?.deallocate()
    }

    /// Connects to the port published as `name` by user `owner` (by default
    /// the caller's own user, the only one a port accepts by default) and
    /// waits at most `timeout` for the owner's loop to accept the
    /// connection. Blocks.
    ///
    /// - Throws: `.nameNotFound` if nobody publishes the name (or its
    ///   owner died); `.foreignOwner` if the process holding the name runs
    ///   as another user than `owner` (someone took the name: nothing is
    ///   sent); `.accessDenied` if the owner does not accept the caller's
    ///   user; `.timedOut` if its loop did not accept in time; `.system`.
    @available(*, noasync, message: "blocks until the owner accepts; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public static func lookup(_ name: String, owner: UInt32? = nil, timeout: Duration = .seconds(5)) throws(PortError) -> RemotePort {
        PortSocketCalls.checkName(name, "RemotePort.lookup")
        require(timeout >= .zero, "RemotePort.lookup: `timeout` is \(timeout); it cannot be negative")
        let expected = owner ?? PortSocketCalls.effectiveUID
        let deadline = MonotonicClock.now.advanced(by: timeout)
        let fd = try PortSocketCalls.connect(name, owner: expected)
        do throws(PortError) {
            let uid = try PortSocketCalls.peerUID(fd)
            guard uid == expected else { throw .foreignOwner(name: name, uid: uid) }
            // The owner's first record says whether it accepts us.
            guard PortSocketCalls.waitReadable(fd, before: deadline) else { throw .timedOut(after: timeout) }
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: PortWire.headerSize, alignment: 8)
            defer { buffer.deallocate() }
            switch PortSocketCalls.receive(fd, into: buffer) {
            case .record(let count, let fds, _):
                PortSocketCalls.close(fds)
                guard count == PortWire.headerSize else { throw .malformed("the owner's greeting is \(count) bytes") }
                switch buffer[4] {
                case PortWire.Kind.welcome.rawValue: return RemotePort(adopting: fd, name: name)
                case PortWire.Kind.refused.rawValue: throw .accessDenied(name)
                default: throw .malformed("the owner's greeting is of kind \(buffer[4])")
                }
            case .nothing: throw .timedOut(after: timeout)
            // Closed before any greeting: the owner died (its listening
            // socket was still being released when we connected).
            case .closed: throw .nameNotFound(name)
            }
        } catch {
            PortSocketCalls.close(fd)
            throw error
        }
    }

    /// Connects to a `NetworkPort` listening at `host` (a dotted IPv4
    /// address) and `port`, waiting at most `timeout` for TCP to connect.
    /// Blocks. The port's `name` is `"host:port"`.
    ///
    /// Across hosts nothing checks who is at either end, and a message
    /// carries bytes only (a `.remotePort` or `LocalPort` throws
    /// `.notTransferable`); every byte buffer travels in the frame.
    ///
    /// With `wireFormat: .foundationSocketPort` it sends Foundation
    /// `SocketPort` frames, to a `NetworkPort` in that format or to a
    /// Foundation program's listening `SocketPort`: one-way messages of byte
    /// buffers only (`sendRequest`, or a port in the envelope, throws
    /// `.unsupportedByFoundationWireFormat`). Foundation's receiver drops
    /// messages under 12 bytes or over about 32 KB and traps on frames that
    /// arrive together: see `PortWireFormat` for how to send to it.
    ///
    /// - Throws: `.nameNotFound` if nothing listens there (connection
    ///   refused); `.timedOut`; `.system` (an address that is not a dotted
    ///   IPv4 address, a network that says no).
    @available(*, noasync, message: "blocks until connected; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public static func connect(
        host: String, port: UInt16, wireFormat: PortWireFormat = .spindle, timeout: Duration = .seconds(5)
    ) throws(PortError) -> RemotePort {
        require(timeout >= .zero, "RemotePort.connect: `timeout` is \(timeout); it cannot be negative")
        let fd = try PortSocketCalls.tcpConnect(host: host, port: port, before: MonotonicClock.now.advanced(by: timeout))
        let transport: Transport
        switch wireFormat {
        case .spindle: transport = .stream
        case .foundationSocketPort: transport = .foundationStream(signature: FoundationPortWire.signature(host: host, port: port))
        }
        return RemotePort(adopting: fd, name: "\(host):\(port)", transport: transport)
    }

    /// The frames it sends: Foundation's `SocketPort`'s if it was connected
    /// in that format, Spindle's otherwise (also for a named port's).
    public var wireFormat: PortWireFormat {
        if case .foundationStream = transport { return .foundationSocketPort }
        return .spindle
    }

    /// Byte buffers of replies received through the owner's shared-memory
    /// ring rather than in the reply or a memfd of their own (see "Large
    /// buffers" above). Any thread; blocks while a request on this port is
    /// in progress (it takes the request lock); stale at once, and orders
    /// nothing.
    public var sharedMemoryReplyBuffers: Int {
        requestLock.withLock { replyRingBuffers }
    }

    /// Whether the port can still send (false after `invalidate()`; a port
    /// whose owner is gone stays valid until a send finds out).
    public var isValid: Bool { lock.withLock { state.valid } }

    /// Sends `message` one way, waiting at most `timeout` for room in the
    /// connection's buffer. Any thread; blocks at most `timeout`.
    ///
    /// - Throws: `.messageTooLarge`, `.tooManyComponents`, `.notTransferable`,
    ///   `.unsupportedByFoundationWireFormat` (nothing sent); `.timedOut`;
    ///   `.peerGone`; `.invalidated`; `.system`.
    @available(*, noasync, message: "waits for room in the connection; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public func send(_ message: PortEnvelope, timeout: Duration) throws(PortError) {
        require(timeout >= .zero, "RemotePort.send: `timeout` is \(timeout); it cannot be negative")
        let deadline = MonotonicClock.now.advanced(by: timeout)
        if case .foundationStream(let signature) = transport {
            let frame = try FoundationPortWire.frame(message, destination: signature)
            try withDescriptor { fd throws(PortError) in try writeFrame(frame, to: fd, before: deadline) }
            return
        }
        try withDescriptor { fd throws(PortError) in try write(message, kind: .oneWay, sequence: 0, to: fd, before: deadline) }
    }

    /// Encodes and sends `message` as one record: on a Unix-domain socket
    /// through `sendRing` (which puts its large buffers in the ring), as a
    /// frame on a stream.
    private func write(
        _ message: PortEnvelope, kind: PortWire.Kind, sequence: UInt64, to fd: Int32, before deadline: MonotonicClock.Instant
    ) throws(PortError) {
        switch transport {
        case .local:
            try sendRing.send(message, kind: kind, sequence: sequence, on: fd, before: deadline)
        case .stream:
            let record = try PortWire.encode(message, kind: kind, sequence: sequence, descriptors: false)
            try writeFrame(PortWire.frame(record.bytes), to: fd, before: deadline)
        case .foundationStream:
            // `send` frames its own messages in this format and
            // `sendRequest` refuses: a Spindle record here is a bug in Spindle.
            misuse("RemotePort: a Spindle record reached a connection in Foundation's SocketPort format")
        }
    }

    /// Writes one whole frame to the stream, so that frames from several
    /// threads do not interleave.
    private func writeFrame(_ frame: [UInt8], to fd: Int32, before deadline: MonotonicClock.Instant) throws(PortError) {
        writeLock.lock()
        defer { writeLock.unlock() }
        try PortSocketCalls.streamSendAll(fd, frame, before: deadline)
    }

    /// Sends `message` as a request and waits for the owner's reply: the
    /// envelope its handler returned (an empty one with the request's id if
    /// it returned nil). Waits at most `timeout` to send and then at most
    /// `replyTimeout` for the reply. Any thread; blocks; one request at a
    /// time per `RemotePort`.
    ///
    /// - Throws: as `send`, and `.replyTimedOut`, or `.peerGone` if the
    ///   owner died or dropped the connection before replying;
    ///   `.unsupportedByFoundationWireFormat` (nothing sent) on a port
    ///   connected in `.foundationSocketPort` format, which has no replies.
    @available(*, noasync, message: "blocks until the reply; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public func sendRequest(_ message: PortEnvelope, timeout: Duration, replyTimeout: Duration) throws(PortError) -> PortEnvelope {
        require(timeout >= .zero, "RemotePort.sendRequest: `timeout` is \(timeout); it cannot be negative")
        require(replyTimeout >= .zero, "RemotePort.sendRequest: `replyTimeout` is \(replyTimeout); it cannot be negative")
        if case .foundationStream = transport {
            throw .unsupportedByFoundationWireFormat("a request (Foundation's SocketPort never replies on the connection a message came on)")
        }
        requestLock.lock()
        defer { requestLock.unlock() }
        let sequence = nextSequence
        nextSequence += 1
        let buffer = replyBuffer ?? {
            let b = UnsafeMutableRawBufferPointer.allocate(byteCount: PortWire.recordCapacity, alignment: 8)
            replyBuffer = b
            return b
        }()
        return try withDescriptor { fd throws(PortError) -> PortEnvelope in
            try write(message, kind: .request, sequence: sequence, to: fd, before: MonotonicClock.now.advanced(by: timeout))
            let deadline = MonotonicClock.now.advanced(by: replyTimeout)
            if transport == .stream {
                return try streamReply(fd, sequence: sequence, buffer: buffer, before: deadline, replyTimeout: replyTimeout)
            }
            while true {
                switch PortSocketCalls.receive(fd, into: buffer) {
                case .record(let count, let fds, let truncated):
                    guard !truncated else {
                        PortSocketCalls.close(fds)
                        throw .malformed("a reply larger than a record can be")
                    }
                    let decoded = try PortWire.decode(UnsafeRawBufferPointer(buffer), count: count, fds: fds, rings: replyRings)
                    replyRingBuffers += replyRings.takeCount()
                    // A late reply to an earlier request that timed out: skip
                    // it; the owner's ring: mapped by the decode, for later.
                    if decoded.kind == .reply && decoded.sequence == sequence { return decoded.envelope }
                case .nothing:
                    guard PortSocketCalls.waitReadable(fd, before: deadline) else { throw .replyTimedOut(after: replyTimeout) }
                case .closed:
                    throw .peerGone
                }
            }
        }
    }

    /// Reads frames from a stream until the reply to request `sequence`.
    /// Under `requestLock`.
    private func streamReply(
        _ fd: Int32, sequence: UInt64, buffer: UnsafeMutableRawBufferPointer, before deadline: MonotonicClock.Instant,
        replyTimeout: Duration
    ) throws(PortError) -> PortEnvelope {
        while true {
            while let frame = try replyFrames.next() {
                let decoded = try PortWire.decode(frame: frame)
                if decoded.kind == .reply && decoded.sequence == sequence { return decoded.envelope }
            }
            switch PortSocketCalls.streamReceive(fd, into: buffer) {
            case .bytes(let n):
                replyFrames.append(UnsafeRawBufferPointer(rebasing: buffer[0..<n]))
            case .nothing:
                guard PortSocketCalls.waitReadable(fd, before: deadline) else { throw .replyTimedOut(after: replyTimeout) }
            case .closed:
                throw .peerGone
            }
        }
    }

    /// Closes this send right: later sends throw `.invalidated`. A send or
    /// request waiting right now returns with `.invalidated`; to wake it,
    /// the connection is shut down, which ends it for every holder of a
    /// copy passed in a message too. Without a send in progress, only this
    /// descriptor closes: copies passed in messages go on working. Any
    /// thread; calling it again does nothing. The owner sees the connection
    /// close when the last copy closes.
    public func invalidate() {
        let close: Int32? = lock.withLock {
            guard state.valid else { return nil }
            state.valid = false
            // A thread sending or waiting for a reply right now polls the
            // socket: shutting it down wakes it (the last user closes it).
            // Without users, closing is enough, and leaves alone the same
            // connection's other descriptors: those passed in messages.
            guard state.users == 0 else {
                PortSocketCalls.shutdown(state.fd)
                return nil
            }
            defer { state.fd = -1 }
            return state.fd
        }
        if let close { PortSocketCalls.close(close) }
    }

    /// A new descriptor for the same connection, for a message that carries
    /// this port (the message's sender closes it once sent).
    func duplicateDescriptor() throws(PortError) -> Int32 {
        try withDescriptor { fd throws(PortError) in try PortSocketCalls.duplicate(fd) }
    }

    /// Runs `body` with the descriptor, which stays open meanwhile even if
    /// another thread invalidates the port; an error after invalidation
    /// becomes `.invalidated`.
    private func withDescriptor<R>(_ body: (Int32) throws(PortError) -> R) throws(PortError) -> R {
        let fd: Int32 = try lock.withLock { () throws(PortError) -> Int32 in
            guard state.valid else { throw .invalidated }
            state.users += 1
            return state.fd
        }
        defer {
            let close: Int32? = lock.withLock {
                state.users -= 1
                guard !state.valid, state.users == 0, state.fd >= 0 else { return nil }
                defer { state.fd = -1 }
                return state.fd
            }
            if let close { PortSocketCalls.close(close) }
        }
        do {
            return try body(fd)
        } catch {
            if !isValid { throw .invalidated }
            throw error
        }
    }
}
