/// A port other hosts reach over TCP: the guide's socket port (Foundation's
/// `SocketPort`, whose frames it can speak). It listens on an IPv4 address and
/// port; a sender connects with `RemotePort.connect(host:port:)` and sends
/// messages, one way or as requests that the port's handler answers, as with a
/// `NamedPort`. The messages arrive through the run loop the port is added to,
/// one per handler call, in the order each sender sent them.
///
///     let port = try NetworkPort(host: "0.0.0.0", port: 7000) { message in
///         PortEnvelope(id: message.id)                    // the reply to a request
///     }
///     ThreadLoop.current.add(port)
///
///     // On another host:
///     let remote = try RemotePort.connect(host: "10.0.0.1", port: 7000)
///     _ = try remote.sendRequest(PortEnvelope(id: 1), timeout: .seconds(1), replyTimeout: .seconds(1))
///
/// ## Framing
///
/// The stream carries frames: a record's length (4 bytes, little-endian)
/// and the record (the layout of `NamedPort`'s messages, every byte buffer
/// inline, no descriptors). A frame is reassembled however the stream cuts
/// it, so messages of any size up to `PortEnvelope.maximumByteCount`
/// arrive whole; several frames in one read are all delivered. A length
/// over the limit, a record that does not add up, or a stream that ends in
/// the middle of a frame is an error on that connection only: it is
/// closed and counted in `malformedFrames`, and the port and its other
/// connections go on. Handlers given to `onDroppedConnection(_:)` learn of
/// each such closing, with a `PortError` that says why.
///
/// ## Stalled frames
///
/// A sender that starts a frame and then stops sending would hold its
/// connection, and the part of the frame buffered so far, for good. So a
/// connection that holds part of a frame and has sent no byte for longer
/// than `stallLimit` (30 seconds unless given at creation) is closed, its
/// buffer freed, and counted in `stalledFrames`; the port and its other
/// connections go on. One timer of the port's loop, in the port's modes,
/// checks the connections that hold part of a frame, when the earliest of
/// them could pass the limit; with none, it never fires. A connection idle
/// between frames is never closed, however long, and a slow sender whose
/// bytes keep coming is not either: the limit is on silence, not on the
/// frame's total time. A `nil` limit turns the check off.
///
/// ## Memory under slow senders
///
/// A frame's header is checked as soon as its first bytes arrive (its
/// length, and for Spindle's frames the record's magic number, kind and
/// component count), so a peer announcing a large frame of garbage is
/// closed before anything is buffered for it. The partial frames of all
/// connections together hold at most `partialFrameMemoryLimit` bytes (64
/// MiB unless given at creation): a read that takes them past it closes
/// the connections holding the most, largest first, until the rest fit
/// (`.partialFramesOverLimit`); the others go on. A frame of 32 KiB or
/// more, up to a sixteenth of the limit (4 MiB by default), counts whole
/// from the moment its header and component table are in: its buffers are
/// allocated then, at their final size, and the stream is read straight
/// into them (see "Large messages").
///
/// ## Large messages
///
/// Bytes are copied as little as TCP allows. A `RemotePort` writes a
/// message of 16 KiB or more with one gathering write of the frame's
/// header and the message's own buffers (smaller ones are copied behind
/// the header, which costs less than gathering). The port reads a large
/// frame (as above) straight into the buffers its handler receives, so
/// each byte is copied by the kernel on each side and nowhere else, and
/// reads on while the socket has bytes (up to 16 reads per readiness
/// event, so that one connection does not hold up the loop's other
/// sources). Smaller frames go through one 64 KiB read buffer, several per
/// read.
///
/// ## Foundation's `SocketPort`
///
/// Made with `wireFormat: .foundationSocketPort`, the port speaks the
/// frames of Foundation's `SocketPort` instead (the layout, and what each
/// side sends and ignores, is in `PortWireFormat`): a Foundation program
/// sends to it with `SocketPort(remoteWithTCPPort:host:)` and
/// `send(before:msgid:components:from:reserved:)`, and a Spindle program
/// reaches a Foundation `SocketPort` with
/// `RemotePort.connect(host:port:wireFormat:timeout:)`. In that format
/// messages are one-way and carry byte buffers only: the handler's result
/// is ignored, and a frame with a port component is malformed. The port
/// reassembles frames of any size up to the envelope limits and takes
/// several per read, which Foundation's own receiver does not.
///
///     let port = try NetworkPort(wireFormat: .foundationSocketPort) { message in
///         print(message.id, message.byteCount)
///         return nil                                      // no reply in this format
///     }
///
/// ## What it does not do
///
/// Nothing authenticates either end: bind to a loopback address
/// (the default, `127.0.0.1`) unless the network is trusted. Ports do not
/// travel between hosts (a `.remotePort` or `LocalPort` component throws
/// `.notTransferable`).
///
/// ## Blocking, invalidation, lifetime
///
/// As for `NamedPort`: the port is one loop's. A reply never waits on the
/// loop's thread: what the requester's socket does not take at once is
/// queued on its connection and written as the socket drains, so a
/// requester that stops reading holds up only itself; once
/// `replyBacklogLimit` bytes wait, its next reply closes the connection
/// (reported to `onDroppedConnection` as `.replyBacklogExceeded`).
/// `invalidate()` or the exit of the loop's thread closes
/// the listener and every connection (senders get `.peerGone`) and runs
/// the `onInvalidation` handlers; until then the port lives and keeps its
/// address. Thread-safe; `Sendable`. Adding it to a second loop is a
/// precondition failure.
public final class NetworkPort: @unchecked Sendable {
    // @unchecked: `state` is guarded by `lock`; `chunk` is used only on the
    // receiving loop's thread inside a descriptor handler, and frames are
    // copied out of it before the handler runs; `stallSweep`'s fire date is
    // set only on the receiving loop's thread (in a descriptor handler or
    // the timer's own); the rest is immutable.

    /// The address it listens on.
    public let host: String
    /// The TCP port it listens on (the one the kernel chose, if 0 was asked).
    public let port: UInt16
    /// The frames its connections carry: Spindle's own, or Foundation's
    /// `SocketPort`'s.
    public let wireFormat: PortWireFormat
    /// How long a connection may hold part of a frame without sending a
    /// byte before the port closes it; nil: as long as it likes. The
    /// type's documentation says how it is checked.
    public let stallLimit: Duration?
    /// How many reply bytes a connection may have waiting for its
    /// requester to read before the port closes it (`.replyBacklogExceeded`).
    /// A reply is queued while fewer than this many wait, so one reply of
    /// any size always fits.
    public let replyBacklogLimit: Int
    /// The most memory all connections together may hold in partial frames
    /// (frames whose bytes are still arriving). Past it, the connections
    /// holding the most are closed, largest first, until the rest fit,
    /// each reported as `.partialFramesOverLimit`.
    public let partialFrameMemoryLimit: Int
    let handler: @Sendable (PortEnvelope) -> PortEnvelope?

    /// Guards `state`; never waited for in a child after `fork()` on a
    /// parent thread's account (`ForkRepairedLock`).
    private let lock = ForkRepairedLock()
    private var state = State()
    /// Where the loop's thread reads into: 64 KiB per read.
    private let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 << 10, alignment: 8)
    private let sentinel: LoopSource
    /// Re-arms the listener after `accept` ran out of descriptors
    /// (`PortAcceptPacing`).
    private let acceptPacing: PortAcceptPacing
    /// Closes stalled connections (`dropStalled`); due when the earliest
    /// partial frame could pass `stallLimit`, in the far future while none
    /// is buffered. Nil without a limit.
    private let stallSweep: LoopTimer?

    private struct Connection {
        let socket: PortDescriptor
        let source: LoopSource
        var frames: PortWire.FrameReader
        /// Reply frames the socket did not take at once, written as it
        /// drains.
        let replies: PortReplyOutbox<[UInt8]>
        /// When the connection's last bytes arrived.
        var lastBytes = MonotonicClock.now
    }

    private struct State {
        var valid = true
        var listener: (socket: PortDescriptor, source: LoopSource)?
        /// By descriptor: a connection's closes only after it leaves.
        var connections: [Int32: Connection] = [:]
        var membership = PortLoopMembership()
        var invalidationHandlers: [@Sendable (NetworkPort) -> Void] = []
        var dropHandlers: [@Sendable (PortError) -> Void] = []
        var malformed = 0
        var stalled = 0
    }

    /// Listens on `host` (a dotted IPv4 address) and `port` (0: a free port
    /// the kernel picks; read it from `port`), its connections carrying
    /// frames of `wireFormat`. Its messages reach `handler` once the port is
    /// added to a loop; what `handler` returns answers a request (ignored
    /// in `.foundationSocketPort` format, which has none). A connection
    /// that holds part of a frame and sends nothing for longer than
    /// `stallLimit` is closed (nil: never). A connection with
    /// `replyBacklogLimit` bytes of replies or more waiting for its
    /// requester to read is closed at its next reply (4 MiB by default).
    /// Partial frames of all connections together may hold at most
    /// `partialFrameMemoryLimit` bytes (64 MiB by default); past it the
    /// largest holders are closed. Never blocks.
    ///
    /// Misuse: a `stallLimit`, `replyBacklogLimit` or
    /// `partialFrameMemoryLimit` of zero or less is a precondition failure.
    ///
    /// - Throws: `.addressInUse` if the address is in use; `.system` for an
    ///   address that is not a dotted IPv4 address, or one the kernel
    ///   refuses.
    public init(
        host: String = "127.0.0.1", port: UInt16 = 0, wireFormat: PortWireFormat = .spindle,
        stallLimit: Duration? = .seconds(30), replyBacklogLimit: Int = 4 << 20, partialFrameMemoryLimit: Int = 64 << 20,
        _ handler: @escaping @Sendable (PortEnvelope) -> PortEnvelope?
    ) throws(PortError) {
        require(replyBacklogLimit > 0, "NetworkPort.init: `replyBacklogLimit` is \(replyBacklogLimit); it must be positive")
        require(
            partialFrameMemoryLimit > 0,
            "NetworkPort.init: `partialFrameMemoryLimit` is \(partialFrameMemoryLimit); it must be positive")
        if let stallLimit {
            require(stallLimit > .zero, "NetworkPort.init: `stallLimit` is \(stallLimit); it must be positive, or nil for no limit")
        }
        let (fd, bound) = try PortSocketCalls.tcpListen(host: host, port: port)
        self.host = host
        self.port = bound
        self.wireFormat = wireFormat
        self.stallLimit = stallLimit
        self.replyBacklogLimit = replyBacklogLimit
        self.partialFrameMemoryLimit = partialFrameMemoryLimit
        self.handler = handler
        let reference = NetworkPortReference()
        acceptPacing = PortAcceptPacing { reference.port?.rearmListener() }
        sentinel = LoopSource(
            cancel: { loop, _ in if loop.ownerThreadHasExited { reference.port?.invalidate() } },
            perform: { _ in })
        // Repeating, so that it stays in the loop between sweeps; each sweep
        // sets its next date itself. Weak: the timer does not keep the port.
        stallSweep = stallLimit.map { limit in
            LoopTimer(fireAt: .distantFuture, interval: limit) { timer in reference.port?.dropStalled(timer) }
        }
        // The listener's source holds the port until invalidation.
        // Re-armed by hand: not while `accept` finds no descriptor to take
        // the connection with (`PortAcceptPacing`).
        state.listener = (PortDescriptor(fd), LoopSource(descriptor: fd, rearmsManually: true) { _, _ in self.acceptWaiting() })
        reference.port = self
    }

    deinit { chunk.deallocate() }

    /// Whether the port still receives. Takes the port's lock briefly.
    public var isValid: Bool { lock.withLock { state.valid } }

    /// Connections closed because of a malformed, oversize or truncated frame.
    public var malformedFrames: Int { lock.withLock { state.malformed } }

    /// Connections closed because they held part of a frame and sent
    /// nothing for longer than `stallLimit`.
    public var stalledFrames: Int { lock.withLock { state.stalled } }

    /// Runs `handler` each time the port closes a connection on its own
    /// account, on the thread of the loop the port is in, once the
    /// connection is closed and counted, with why:
    /// `.malformed` for a frame that is oversize, does not add up (its
    /// header is checked as soon as it arrives) or is cut short by the end
    /// of the stream (each also counted in `malformedFrames`);
    /// `.partialFramesOverLimit` for the largest holders of partial frames
    /// once all together passed `partialFrameMemoryLimit`; `.frameStalled` for a partial frame silent past
    /// `stallLimit` (counted in `stalledFrames`); `.replyBacklogExceeded`
    /// for a requester that left `replyBacklogLimit` reply bytes unread;
    /// the send's error for a reply that could not be sent. Not for a sender that closes between
    /// frames, nor for the port's own invalidation. Handlers run in the
    /// Also told, once per run of failures, `.system` for an `accept` that
    /// found the process or system out of descriptors or memory: no
    /// connection closes then (it waits in the kernel's backlog), and the
    /// port stops watching its listener, retrying after a back-off of 10 ms
    /// doubling to 1 s, so it never spins (`exhaustedAccepts` counts them).
    /// order added; add them before the port starts receiving to see every
    /// closing. Any thread;
    /// takes the port's lock briefly and never blocks otherwise. A handler
    /// that blocks holds up the port's loop.
    public func onDroppedConnection(_ handler: @escaping @Sendable (PortError) -> Void) {
        lock.withLock { state.dropHandlers.append(handler) }
    }

    /// Bytes the connections hold right now in frames still arriving (at
    /// most `partialFrameMemoryLimit` once the port has handled its
    /// reads); a large frame read straight into its buffers counts whole
    /// (the type's documentation says which). Takes the port's lock briefly; stale at once.
    public var partialFrameBytes: Int {
        lock.withLock { state.connections.values.reduce(0) { $0 + $1.frames.partialFrameBytes } }
    }

    /// How many senders are connected right now.
    public var connectionCount: Int { lock.withLock { state.connections.count } }

    // MARK: Loops

    /// Adds the port to `mode` of `loop` (or every common mode, for
    /// `.common`). Any thread. A loop whose thread has exited invalidates
    /// the port. Misuse: a second loop is a precondition failure.
    public func schedule(in loop: ThreadLoop, forMode mode: LoopMode = .default) {
        let sources: [LoopSource]? = lock.withLock {
            guard state.valid else { return nil }
            return state.membership.join(loop, forMode: mode) ? allSources() : []
        }
        guard let sources else { return }
        require(!sources.isEmpty, "NetworkPort.schedule(in:forMode:): the port is already received by another loop; a port is received by one loop")
        for s in sources { loop.add(s, forMode: mode) }
        loop.add(acceptPacing.timer, forMode: mode)
        if let stallSweep { loop.add(stallSweep, forMode: mode) }
        if loop.ownerThreadHasExited { invalidate() }
    }

    /// Removes the port from `mode` of `loop`. Any thread.
    public func remove(from loop: ThreadLoop, forMode mode: LoopMode = .default) {
        let sources: [LoopSource] = lock.withLock {
            state.membership.leave(loop, forMode: mode) ? allSources() : []
        }
        guard !sources.isEmpty else { return }
        for s in sources { loop.remove(s, forMode: mode) }
        loop.remove(acceptPacing.timer, forMode: mode)
        if let stallSweep { loop.remove(stallSweep, forMode: mode) }
    }

    /// Under `lock`.
    private func allSources() -> [LoopSource] {
        var all = [sentinel]
        if let listener = state.listener { all.append(listener.source) }
        all.append(contentsOf: state.connections.values.map(\.source))
        all.append(contentsOf: state.connections.values.compactMap(\.replies.currentWriter))
        return all
    }

    // MARK: Receiving (the loop's thread)

    /// Accepts every waiting connection and adds it to the loop;
    /// `acceptPacing` runs the loop and backs off when descriptors run out.
    private func acceptWaiting() {
        guard let listener = lock.withLock({ state.listener?.socket }) else { return }
        _ = listener.use { fd in acceptPacing.acceptAll(on: fd, take: adopt, report: report) }
    }

    /// Adds a connection just accepted; false (and closed) once the port is
    /// invalid.
    private func adopt(_ fd: Int32) -> Bool {
        PortSocketCalls.tcpNoDelay(fd)
        // From the table on, another thread's invalidation may close it.
        let socket = PortDescriptor(fd)
        let source = LoopSource(descriptor: fd) { _, _ in self.receive(on: socket) }
        let replies = PortReplyOutbox<[UInt8]>(streamOf: socket, limit: replyBacklogLimit) { error in
            self.drop(socket, malformed: false, reason: error)
        }
        let placement: (ThreadLoop?, [LoopMode])? = lock.withLock {
            guard state.valid else { return nil }
            state.connections[fd] = Connection(
                socket: socket,
                source: source,
                frames: PortWire.FrameReader(wireFormat, directLimit: partialFrameMemoryLimit / Self.directFrameShare),
                replies: replies)
            return (state.membership.loop, state.membership.currentModes)
        }
        guard let (loop, modes) = placement else {
            socket.close()
            return false
        }
        if let loop { for m in modes { loop.add(source, forMode: m) } }
        return true
    }

    /// Tells the drop handlers `error` (an exhausted `accept`).
    private func report(_ error: PortError) {
        for handler in lock.withLock({ state.dropHandlers }) { handler(error) }
    }

    /// Accepts that failed because the process or the system was out of
    /// descriptors or memory; each run of them was reported once to the
    /// drop handlers. Any thread; takes a short lock; stale at once.
    public var exhaustedAccepts: Int { acceptPacing.failureCount }

    /// Watches the listener again (`acceptPacing`).
    fileprivate func rearmListener() {
        let (loop, source) = lock.withLock { (state.membership.loop, state.listener?.source) }
        if let loop, let source { loop.rearm(source) }
    }

    /// Closes a connection the port gives up on, counts it in
    /// `malformedFrames` if `malformed`, and tells the drop handlers
    /// `reason` (nil: a sender's own clean close, told to nobody).
    private func drop(_ socket: PortDescriptor, malformed: Bool, reason: PortError?) {
        let dropped: (Connection, [@Sendable (PortError) -> Void])? = lock.withLock {
            // This connection's entry, not a later one's under the same
            // descriptor number.
            guard state.connections[socket.fd]?.socket === socket,
                let connection = state.connections.removeValue(forKey: socket.fd)
            else { return nil }
            if malformed { state.malformed += 1 }
            return (connection, state.dropHandlers)
        }
        guard let (connection, handlers) = dropped else { return }
        Self.close(connection)
        if let reason { for handler in handlers { handler(reason) } }
    }

    /// Ends a connection that left the table: its replies, its source and
    /// its socket. The socket is shut down before it closes, as NamedPort
    /// does: the event backend may hold it until its next pass, and the
    /// peer must see the end now; it closes once no call uses it
    /// (`PortDescriptor`).
    private static func close(_ connection: Connection) {
        connection.replies.close()
        connection.source.invalidate()
        connection.socket.close()
    }

    // MARK: Stalled frames (the loop's thread)

    /// Makes sure `stallSweep` runs by the time `fd`'s partial frame, if it
    /// holds one, could pass `stallLimit`.
    private func watchForStall(_ fd: Int32) {
        guard let stallLimit, let stallSweep else { return }
        let since: MonotonicClock.Instant? = lock.withLock {
            guard let connection = state.connections[fd], connection.frames.hasPartialFrame else { return nil }
            return connection.lastBytes
        }
        guard let since else { return }
        let due = since + stallLimit
        if due < stallSweep.fireDate { stallSweep.fireDate = due }
    }

    /// `stallSweep`'s handler: closes every connection whose partial frame
    /// has waited `stallLimit` or longer for its next byte, and sets the
    /// sweep's next date by the partial frames left (the far future if none).
    /// A connection with bytes waiting in the kernel is not stalled: they
    /// came while the loop was busy (a slow handler), and its source reads
    /// them next, which sets the sweep again if the frame is still partial.
    private func dropStalled(_ sweep: LoopTimer) {
        guard let stallLimit else { return }
        let now = MonotonicClock.now
        var next = MonotonicClock.Instant.distantFuture
        let (stalled, handlers): ([Int32: Connection], [@Sendable (PortError) -> Void]) = lock.withLock {
            var stalled: [Int32: Connection] = [:]
            for (fd, connection) in state.connections where connection.frames.hasPartialFrame {
                let due = connection.lastBytes + stallLimit
                if due > now {
                    next = min(next, due)
                } else if !PortSocketCalls.waitReadable(fd, before: now) {  // a poll that never waits
                    stalled[fd] = connection
                }
            }
            for fd in stalled.keys { state.connections[fd] = nil }
            state.stalled += stalled.count
            return (stalled, state.dropHandlers)
        }
        for connection in stalled.values {
            Self.close(connection)
            for handler in handlers { handler(.frameStalled(after: stallLimit)) }
        }
        sweep.fireDate = next
    }

    /// A frame of up to this share of `partialFrameMemoryLimit` (and of
    /// 32 KiB or more) is read straight into its buffers, which are
    /// allocated, and counted, when its header arrives
    /// (`PortWire.FrameReader`); larger ones are buffered as they come.
    static let directFrameShare = 16

    /// At most this many reads per readiness event, so that one busy
    /// connection does not hold up the loop's other sources.
    private static let readsPerEvent = 16

    /// Reads what the connection has, and hands every whole frame to the
    /// handler, one message per call, as it completes. A read that fills
    /// its buffer is followed by another (up to `readsPerEvent`), so a
    /// large frame takes few readiness events; a large frame under way is
    /// read straight into its buffers, the others through `chunk`.
    private func receive(on socket: PortDescriptor) {
        _ = socket.use { fd in receive(on: socket, fd: fd) }
    }

    /// `receive`, with the socket held open.
    private func receive(on socket: PortDescriptor, fd: Int32) {
        for _ in 0..<Self.readsPerEvent {
            let step: ReadStep = lock.withLock {
                guard state.connections[fd] != nil else { return .gone }
                var size = 0
                let direct = state.connections[fd]!.frames.readDirect { buffer in
                    size = buffer.count
                    return PortSocketCalls.streamReceive(fd, into: buffer)
                }
                guard let direct else { return .throughChunk(limit: state.connections[fd]!.frames.nextReadLimit) }
                guard case .bytes(let n) = direct else { return .read(direct, full: false) }
                state.connections[fd]!.lastBytes = .now
                return .read(direct, full: n == size)
            }
            let result: (PortSocketCalls.StreamRead, full: Bool)?
            switch step {
            case .gone: result = nil
            case .throughChunk(let limit): result = readIntoChunk(fd, limit: limit)
            case .read(let read, let full): result = (read, full)
            }
            guard let (read, full) = result else { return }
            switch read {
            case .nothing:
                return
            case .closed:
                let partial = lock.withLock { state.connections[fd]?.frames.hasPartialFrame ?? false }
                drop(socket, malformed: partial, reason: partial ? .malformed("the stream ended in the middle of a frame") : nil)
                return
            case .bytes:
                guard deliverFrames(on: socket) else { return }
            }
            if !full { return }
        }
    }

    private enum ReadStep {
        /// The connection was dropped.
        case gone
        /// No frame is read straight into its buffers: read into `chunk`
        /// (at most `limit` bytes, if given: `FrameReader.nextReadLimit`).
        case throughChunk(limit: Int?)
        /// A read straight into a frame's buffers, and whether it filled
        /// the space it was given.
        case read(PortSocketCalls.StreamRead, full: Bool)
    }

    /// One read into `chunk`, appended to the connection's frames; nil if
    /// the connection is gone.
    private func readIntoChunk(_ fd: Int32, limit: Int?) -> (PortSocketCalls.StreamRead, full: Bool)? {
        let buffer = UnsafeMutableRawBufferPointer(rebasing: chunk[0..<min(chunk.count, limit ?? chunk.count)])
        let read = PortSocketCalls.streamReceive(fd, into: buffer)
        guard case .bytes(let n) = read else { return (read, false) }
        let ok: Bool = lock.withLock {
            guard state.connections[fd] != nil else { return false }
            state.connections[fd]!.frames.append(UnsafeRawBufferPointer(rebasing: chunk[0..<n]))
            state.connections[fd]!.lastBytes = .now
            return true
        }
        return ok ? (read, n == buffer.count) : nil
    }

    /// Hands every whole frame the connection holds to the handler. False
    /// if the connection was dropped meanwhile. With the socket held open
    /// (`receive`), so that its descriptor number is its own.
    private func deliverFrames(on socket: PortDescriptor) -> Bool {
        let fd = socket.fd
        while true {
            let next: Result<PortWire.Frame?, PortError>? = lock.withLock {
                guard state.connections[fd] != nil else { return nil }
                do throws(PortError) {
                    return .success(try state.connections[fd]!.frames.next())
                } catch {
                    return .failure(error)
                }
            }
            let frame: PortWire.Frame
            switch next {
            case nil: return false
            case .success(let f?)?: frame = f
            case .success(nil)?:
                watchForStall(fd)
                shedPartialFrames()
                return lock.withLock { state.connections[fd] != nil }
            case .failure(let error)?:
                drop(socket, malformed: true, reason: error)
                return false
            }
            let decoded: PortWire.Decoded
            do throws(PortError) {
                switch (frame, wireFormat) {
                case (.decoded(let d), _):
                    decoded = d
                case (.record(let record), .spindle):
                    decoded = try PortWire.decode(frame: record)
                case (.record(let record), .foundationSocketPort):
                    decoded = PortWire.Decoded(kind: .oneWay, sequence: 0, envelope: try FoundationPortWire.decode(record))
                }
            } catch {
                drop(socket, malformed: true, reason: error)
                return false
            }
            switch decoded.kind {
            case .oneWay:
                _ = handler(decoded.envelope)
            case .request:
                let reply = handler(decoded.envelope) ?? PortEnvelope(id: decoded.envelope.id)
                do throws(PortError) {
                    try queueReply(PortWire.contiguousStreamFrame(reply, kind: .reply, sequence: decoded.sequence), on: fd)
                } catch {
                    drop(socket, malformed: false, reason: error)
                    return false
                }
            case .reply, .welcome, .refused, .ring:
                drop(socket, malformed: true, reason: .malformed("a \(decoded.kind) frame, which a listening port never receives"))
                return false
            }
        }
    }

    // MARK: Memory held by partial frames (the loop's thread)

    /// Closes the connections holding the most memory in partial frames,
    /// largest first, until all of them together hold at most
    /// `partialFrameMemoryLimit`; each is told to the drop handlers as
    /// `.partialFramesOverLimit`. A sum over the connections, taken after a
    /// read left a partial frame.
    private func shedPartialFrames() {
        let (shed, handlers, total): ([(Int32, Connection, Int)], [@Sendable (PortError) -> Void], Int) = lock.withLock {
            var total = 0
            for c in state.connections.values { total += c.frames.partialFrameBytes }
            guard total > partialFrameMemoryLimit else { return ([], [], total) }
            let held = state.connections.map { ($0.key, $0.value.frames.partialFrameBytes) }.filter { $0.1 > 0 }.sorted { $0.1 > $1.1 }
            var shed: [(Int32, Connection, Int)] = []
            let before = total
            for (fd, bytes) in held where total > partialFrameMemoryLimit {
                if let c = state.connections.removeValue(forKey: fd) { shed.append((fd, c, bytes)) }
                total -= bytes
            }
            return (shed, state.dropHandlers, before)
        }
        for (_, connection, bytes) in shed {
            Self.close(connection)
            for handler in handlers {
                handler(.partialFramesOverLimit(connectionBytes: bytes, totalBytes: total, limit: partialFrameMemoryLimit))
            }
        }
    }

    // MARK: Replies (the loop's thread)

    /// Sends `frame` on `fd` as far as the socket takes it now, and queues
    /// the rest behind the connection's earlier replies, to go as the socket
    /// drains (`PortReplyOutbox`): a requester that does not read holds up
    /// only its own connection, never the loop. Throws
    /// `.replyBacklogExceeded` if `replyBacklogLimit` bytes or more wait
    /// already, and the send's error if the peer is gone; the caller drops
    /// the connection.
    private func queueReply(_ frame: [UInt8], on fd: Int32) throws(PortError) {
        guard let replies = lock.withLock({ state.connections[fd]?.replies }) else { return }  // dropped meanwhile
        guard let writer = try replies.send(frame) else { return }
        let (loop, modes) = lock.withLock { (state.membership.loop, state.membership.currentModes) }
        if let loop { for m in modes { loop.add(writer, forMode: m) } }
    }

    // MARK: Invalidation

    /// Stops the port for good: closes the listener and every connection,
    /// leaves its loop, and runs the invalidation handlers on the calling
    /// thread. Any thread; calling it again does nothing.
    public func invalidate() {
        let taken: (listener: (socket: PortDescriptor, source: LoopSource)?, connections: [Int32: Connection], handlers: [@Sendable (NetworkPort) -> Void])? =
            lock.withLock {
                guard state.valid else { return nil }
                state.valid = false
                defer {
                    state.listener = nil
                    state.connections = [:]
                    state.invalidationHandlers = []
                }
                return (state.listener, state.connections, state.invalidationHandlers)
            }
        guard let taken else { return }
        sentinel.invalidate()
        acceptPacing.timer.invalidate()
        stallSweep?.invalidate()
        // A socket the loop's thread is using right now closes as that
        // use ends (`PortDescriptor`).
        if let listener = taken.listener {
            listener.source.invalidate()
            listener.socket.close()
        }
        for connection in taken.connections.values { Self.close(connection) }
        for handler in taken.handlers { handler(self) }
    }

    /// Runs `handler` once when the port is invalidated, on the invalidating
    /// thread; at once if it is invalid already. Any thread.
    public func onInvalidation(_ handler: @escaping @Sendable (NetworkPort) -> Void) {
        let now = lock.withLock {
            guard state.valid else { return true }
            state.invalidationHandlers.append(handler)
            return false
        }
        if now { handler(self) }
    }
}

extension ThreadLoop {
    /// Adds `port` to `mode`: see `NetworkPort.schedule(in:forMode:)`.
    public func add(_ port: NetworkPort, forMode mode: LoopMode = .default) {
        port.schedule(in: self, forMode: mode)
    }

    /// Removes `port` from `mode`: see `NetworkPort.remove(from:forMode:)`.
    public func remove(_ port: NetworkPort, forMode mode: LoopMode = .default) {
        port.remove(from: self, forMode: mode)
    }
}

private final class NetworkPortReference: @unchecked Sendable {
    // @unchecked: `port` is set in the port's init, before the sentinel can
    // be added to any loop (whose lock then publishes it); weak loads are
    // safe against deallocation.
    weak var port: NetworkPort?
}
