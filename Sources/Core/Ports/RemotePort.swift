#if canImport(Glibc)
import Glibc
#endif

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
/// ## After `fork()`
///
/// A child process that inherited the port never uses its parent's
/// connection: its first send or request makes a connection of its own
/// (a looked-up port is looked up again by name and owner, a network port
/// connected again, within that call's send timeout), with its own ring and
/// its own request sequence, so replies never go to the wrong process and
/// the owner sees each process as one connection, dropped (and its ring
/// freed) when that process exits. A port with no address to go back to (one
/// received in a message, or made by `NamedPort.makeSendRight()`) throws
/// `.inheritedAcrossFork` in the child instead: look the port up by name
/// there, or have it sent a send right of its own after the fork. The
/// parent's connection is untouched by anything the child does. A child
/// forked while other threads of the parent were sending or waiting for
/// replies on the port never waits for them (they do not exist in the
/// child): the port's state lock is freed on the child's first use.
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
    // @unchecked: `state` is guarded by `lock`; request state by its
    // link's `requestLock`; `name`, `transport` and `reconnection` are
    // immutable.

    /// The name it was looked up by; nil for a port received in a message
    /// or made by `NamedPort.makeSendRight()`.
    public let name: String?

    /// A Unix-domain sequenced-packet socket (records, descriptors), or a
    /// TCP stream (frames, bytes only) in Spindle's framing or in
    /// Foundation's, whose every frame names its destination by the
    /// signature `foundationStream` carries. (Its payload has no label: a
    /// labelled one is a tuple whose metadata a debug build makes at run
    /// time, which `prepareForFork` could not name.)
    enum Transport: Equatable {
        case local
        case stream
        case foundationStream([UInt8])
    }

    private let transport: Transport
    /// How a process that inherited the port through `fork()` makes a
    /// connection of its own: nil for a port with no address to go back
    /// to (received in a message, or made by `makeSendRight()`).
    private let reconnection: Reconnection?
    /// Guards `state`. A child after `fork()` never waits for it on a
    /// parent thread's account (`ForkRepairedLock`): it then finds the
    /// parent's pid in `state` and makes a connection of its own
    /// (`reconnectAfterFork`).
    private let lock = ForkRepairedLock()
    private var state: State

    enum Reconnection {
        /// Look the name up again, expecting owner `uid`.
        case lookup(name: String, uid: UInt32)
        /// Connect to the address again.
        case tcp(host: String, port: UInt16)
    }

    /// What one process's connection needs beside its descriptor: its
    /// locks, request sequence, reply buffer and rings. A process that
    /// inherited the port through `fork()` makes a connection of its own
    /// and a new `Link` with it, so nothing here is ever shared across
    /// processes, and a lock a thread of the parent held at the fork (which
    /// nobody would release in the child) is never waited for.
    private final class Link: @unchecked Sendable {
        // @unchecked: `replyFrames`, `nextSequence`, `replyBuffer` and
        // `replyRingBuffers` are guarded by `requestLock`; the rest is
        // immutable or guards itself.

        /// Held while a frame is written to a stream, so that frames from
        /// several threads do not interleave.
        let writeLock = Lock()
        /// Held for the whole of a request, so that its reply is read by
        /// its requester.
        let requestLock = Lock()
        /// Reply frames read from a stream and not yet taken.
        var replyFrames = PortWire.FrameReader()
        var nextSequence: UInt64 = 1
        var replyBuffer: UnsafeMutableRawBufferPointer?
        /// This connection's ring for buffers too large to go inline, made
        /// with the first such message (`PortSendRing`; a named port's only).
        let sendRing = PortSendRing()
        /// The owner's ring for large buffers in its replies, once it sent one.
        let replyRings = PortReceiveRings()
        var replyRingBuffers = 0

        deinit { replyBuffer?.deallocate() }
    }

    private struct State {
        var fd: Int32
        var valid = true
        /// Calls using `fd` right now; the last one out closes it once the
        /// port is invalid.
        var users = 0
        /// The process whose connection `fd` is: the one that made or
        /// received the port, or the child that reconnected after `fork()`.
        var pid: pid_t
        var link = Link()
    }

    /// In the parent, before `fork()` (`PortWire.prepareForFork`): the
    /// generic types this file's code makes on first use, some of them
    /// private to it.
    static func prepareForFork() {
        ForkHandlers.makeMetadata(Link?.self, Int32?.self, (Int32?, Link?).self, (Int32, Link)?.self)
    }

    /// A port over `fd`, which it now owns (closes when invalidated or
    /// deinitialized); `reconnection` is how a child process gets a
    /// connection of its own.
    init(adopting fd: Int32, name: String?, transport: Transport = .local, reconnection: Reconnection? = nil) {
        _ = PortWire.forkWarmUpRegistered
        state = State(fd: fd, pid: getpid())
        self.name = name
        self.transport = transport
        self.reconnection = reconnection
    }

    deinit {
        if state.fd >= 0 { PortSocketCalls.close(state.fd) }
    }

    /// Connects to the port published as `name` by user `owner` (by default
    /// the caller's own user, the only one a port accepts by default) and
    /// waits at most `timeout` for the owner's loop to accept the
    /// connection. Blocks, at most `timeout` in all: the connect itself
    /// waits only while the owner's backlog is full (its loop is not
    /// accepting), and only until the deadline.
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
        let fd = try connectAndGreet(name, owner: expected, timeout: timeout)
        return RemotePort(adopting: fd, name: name, reconnection: .lookup(name: name, uid: expected))
    }

    /// `lookup`'s connection: connected, its owner checked, and welcomed.
    private static func connectAndGreet(_ name: String, owner expected: UInt32, timeout: Duration) throws(PortError) -> Int32 {
        let deadline = MonotonicClock.now.advanced(by: timeout)
        let fd = try PortSocketCalls.connect(name, owner: expected, before: deadline)
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
                case PortWire.Kind.welcome.rawValue: return fd
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
    /// - Throws: `.connectionFailed` with the errno if TCP cannot connect
    ///   (`ECONNREFUSED`: nothing listens there; `EHOSTUNREACH`,
    ///   `ENETUNREACH`, `ETIMEDOUT`...); `.timedOut` if `timeout` passed
    ///   first; `.system` (an address that is not a dotted IPv4 address, no
    ///   descriptors or memory left).
    @available(*, noasync, message: "blocks until connected; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public static func connect(
        host: String, port: UInt16, wireFormat: PortWireFormat = .spindle, timeout: Duration = .seconds(5)
    ) throws(PortError) -> RemotePort {
        require(timeout >= .zero, "RemotePort.connect: `timeout` is \(timeout); it cannot be negative")
        let fd = try PortSocketCalls.tcpConnect(host: host, port: port, before: MonotonicClock.now.advanced(by: timeout))
        let transport: Transport
        switch wireFormat {
        case .spindle: transport = .stream
        case .foundationSocketPort: transport = .foundationStream(FoundationPortWire.signature(host: host, port: port))
        }
        return RemotePort(adopting: fd, name: "\(host):\(port)", transport: transport, reconnection: .tcp(host: host, port: port))
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
        // In a child that has not reconnected yet, the link is the parent's
        // (whose request lock a parent thread may have held at the fork):
        // none of its replies are this process's.
        let link: Link? = lock.withLock { state.pid == getpid() ? state.link : nil }
        guard let link else { return 0 }
        return link.requestLock.withLock { link.replyRingBuffers }
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
            try withDescriptor(before: deadline) { fd, link throws(PortError) in try writeFrame(frame, to: fd, link: link, before: deadline) }
            return
        }
        try withDescriptor(before: deadline) { fd, link throws(PortError) in
            try write(message, kind: .oneWay, sequence: 0, to: fd, link: link, before: deadline)
        }
    }

    /// Encodes and sends `message` as one record: on a Unix-domain socket
    /// through `sendRing` (which puts its large buffers in the ring), as a
    /// frame on a stream.
    private func write(
        _ message: PortEnvelope, kind: PortWire.Kind, sequence: UInt64, to fd: Int32, link: Link,
        before deadline: MonotonicClock.Instant
    ) throws(PortError) {
        switch transport {
        case .local:
            try link.sendRing.send(message, kind: kind, sequence: sequence, on: fd, before: deadline)
        case .stream:
            // Small frames go out in one buffer; larger ones with one
            // gathering write from the message's own buffers, copying none.
            if message.byteCount < Self.gatheringThreshold {
                try writeFrame(PortWire.contiguousStreamFrame(message, kind: kind, sequence: sequence), to: fd, link: link, before: deadline)
            } else {
                let (head, parts) = try PortWire.streamFrame(message, kind: kind, sequence: sequence)
                link.writeLock.lock()
                defer { link.writeLock.unlock() }
                try PortSocketCalls.streamSendAll(fd, head: head, parts: parts, before: deadline)
            }
        case .foundationStream:
            // `send` frames its own messages in this format and
            // `sendRequest` refuses: a Spindle record here is a bug in Spindle.
            misuse("RemotePort: a Spindle record reached a connection in Foundation's SocketPort format")
        }
    }

    /// Messages of at least this many bytes go out over TCP straight from
    /// their buffers (`PortSocketCalls.streamSendAll(_:head:parts:before:)`);
    /// below it, copying them behind the header is cheaper than gathering.
    static let gatheringThreshold = 16 << 10

    /// Writes one whole frame to the stream, so that frames from several
    /// threads do not interleave.
    private func writeFrame(_ frame: [UInt8], to fd: Int32, link: Link, before deadline: MonotonicClock.Instant) throws(PortError) {
        link.writeLock.lock()
        defer { link.writeLock.unlock() }
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
        return try request(message, sendDeadline: MonotonicClock.now.advanced(by: timeout), replyDeadline: nil, replyTimeout: replyTimeout)
    }

    /// The request itself: sends by `sendDeadline`, then waits for the reply
    /// until `replyDeadline`, or (nil) for `replyTimeout` from the moment
    /// the request went out. `.replyTimedOut` carries the time waited for
    /// the reply.
    func request(
        _ message: PortEnvelope, sendDeadline: MonotonicClock.Instant, replyDeadline: MonotonicClock.Instant?, replyTimeout: Duration
    ) throws(PortError) -> PortEnvelope {
        if case .foundationStream = transport {
            throw .unsupportedByFoundationWireFormat("a request (Foundation's SocketPort never replies on the connection a message came on)")
        }
        return try withDescriptor(before: sendDeadline) { fd, link throws(PortError) -> PortEnvelope in
            link.requestLock.lock()
            defer { link.requestLock.unlock() }
            let sequence = link.nextSequence
            link.nextSequence += 1
            let buffer = link.replyBuffer ?? {
                let b = UnsafeMutableRawBufferPointer.allocate(byteCount: PortWire.recordCapacity, alignment: 8)
                link.replyBuffer = b
                return b
            }()
            try write(message, kind: .request, sequence: sequence, to: fd, link: link, before: sendDeadline)
            let sent = MonotonicClock.now
            let deadline = replyDeadline ?? sent.advanced(by: replyTimeout)
            let replyTimeout = max(.zero, sent.duration(to: deadline))
            if transport == .stream {
                return try streamReply(fd, link: link, sequence: sequence, buffer: buffer, before: deadline, replyTimeout: replyTimeout)
            }
            while true {
                switch PortSocketCalls.receive(fd, into: buffer) {
                case .record(let count, let fds, let truncated):
                    guard !truncated else {
                        PortSocketCalls.close(fds)
                        throw .malformed("a reply larger than a record can be")
                    }
                    let decoded = try PortWire.decode(UnsafeRawBufferPointer(buffer), count: count, fds: fds, rings: link.replyRings)
                    link.replyRingBuffers += link.replyRings.takeCount()
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
    /// Under the link's `requestLock`.
    private func streamReply(
        _ fd: Int32, link: Link, sequence: UInt64, buffer: UnsafeMutableRawBufferPointer, before deadline: MonotonicClock.Instant,
        replyTimeout: Duration
    ) throws(PortError) -> PortEnvelope {
        while true {
            while let frame = try link.replyFrames.next() {
                let decoded: PortWire.Decoded
                switch frame {
                case .record(let record): decoded = try PortWire.decode(frame: record)
                case .decoded(let d): decoded = d
                }
                if decoded.kind == .reply && decoded.sequence == sequence { return decoded.envelope }
            }
            // A large reply under way is read straight into its buffers.
            let read = link.replyFrames.readDirect { PortSocketCalls.streamReceive(fd, into: $0) }
            switch read ?? PortSocketCalls.streamReceive(fd, into: buffer) {
            case .bytes(let n):
                if read == nil { link.replyFrames.append(UnsafeRawBufferPointer(rebasing: buffer[0..<n])) }
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
            // connection's other descriptors: those passed in messages. A
            // connection inherited through fork() is the parent's: its
            // users are the parent's threads, and a shutdown would end it
            // for the parent too; only this process's copy closes.
            guard state.users == 0 || state.pid != getpid() else {
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
        try withDescriptor(before: MonotonicClock.now.advanced(by: .seconds(5))) { fd, _ throws(PortError) in
            try PortSocketCalls.duplicate(fd)
        }
    }

    /// Gives process `pid` (a child that inherited the port through `fork()`)
    /// a connection of its own, so that its messages and its replies never
    /// mix with its parent's on one socket: a named port is looked up again,
    /// a network port connected again, each waiting until `deadline` at
    /// most. A port with no address to go back to throws
    /// `.inheritedAcrossFork`. The inherited descriptor is closed (only
    /// this process's copy: the parent's connection goes on), never shut
    /// down, and the parent's link (whose locks a thread of the parent may
    /// have held at the fork) is dropped unused.
    private func reconnectAfterFork(pid: pid_t, before deadline: MonotonicClock.Instant) throws(PortError) {
        let fd: Int32
        switch reconnection {
        case nil:
            throw .inheritedAcrossFork(name)
        case .lookup(let name, let uid):
            fd = try Self.connectAndGreet(name, owner: uid, timeout: MonotonicClock.now.duration(to: deadline))
        case .tcp(let host, let port):
            fd = try PortSocketCalls.tcpConnect(host: host, port: port, before: deadline)
        }
        let link = Link()
        let (inherited, parentLink): (Int32?, Link?) = lock.withLock {
            // Another thread of this process may have reconnected first, or
            // invalidated the port meanwhile: then this connection goes.
            guard state.valid, state.pid != pid else { return (fd, nil) }
            defer {
                state.fd = fd
                state.pid = pid
                state.users = 0
                state.link = link
            }
            return (state.fd >= 0 ? state.fd : nil, state.link)
        }
        // The parent's link is kept, never released here: its locks' teardown
        // would take the lock-name and lock-order tables' locks, which a
        // thread of the parent may have held at the fork. Once per port
        // and fork, a few hundred bytes.
        if let parentLink { _ = Unmanaged.passRetained(parentLink) }
        if let inherited { PortSocketCalls.close(inherited) }
    }

    /// Runs `body` with the descriptor and its link, which stay open
    /// meanwhile even if another thread invalidates the port; an error after
    /// invalidation becomes `.invalidated`. In a process that inherited the
    /// port through `fork()`, first makes the process's own connection,
    /// waiting for it until `deadline` (see `reconnectAfterFork`).
    private func withDescriptor<R>(
        before deadline: MonotonicClock.Instant, _ body: (Int32, Link) throws(PortError) -> R
    ) throws(PortError) -> R {
        let pid = getpid()
        var acquired: (Int32, Link)?
        while acquired == nil {
            let current: (Int32, Link)? = try lock.withLock { () throws(PortError) -> (Int32, Link)? in
                guard state.valid else { throw .invalidated }
                guard state.pid == pid else { return nil }
                state.users += 1
                return (state.fd, state.link)
            }
            if let current { acquired = current } else { try reconnectAfterFork(pid: pid, before: deadline) }
        }
        guard let (fd, link) = acquired else { misuse("RemotePort: no descriptor after the loop") }
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
            return try body(fd, link)
        } catch {
            if !isValid { throw .invalidated }
            throw error
        }
    }
}
