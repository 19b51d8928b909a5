/// A port other processes reach: the guide's message port (Foundation's
/// `MessagePort`, which Linux lacks). A process publishes it under a name;
/// another looks the name up (`RemotePort.lookup`) and sends it messages, one
/// way or as requests that the port's handler answers. The messages arrive
/// through the run loop the port is added to, one per handler call, in the
/// order each sender sent them.
///
///     // Owner: publish, then run the loop.
///     let port = try NamedPort(name: "com.example.indexer") { message in
///         message.id == 2 ? PortEnvelope(id: 2, components: [.bytes(Array("done".utf8))]) : nil
///     }
///     ThreadLoop.current.add(port)
///     ThreadLoop.current.run()
///
/// ## Names
///
/// A name lives in Linux's abstract socket namespace, as
/// `spindle.<uid>.<name>` (`uid` the owner's user id): an `AF_UNIX` socket
/// address that is no file, so nothing is left behind, and that the kernel
/// frees the moment the owner's listening socket closes, which includes the
/// owner's death. A name already published throws `PortError.nameTaken`. A
/// per-user runtime directory would give file permissions, but leaves a
/// stale file when its owner dies, which the next owner must tell apart
/// from a live one; the abstract name cannot go stale. Abstract names have
/// no permissions and belong to the network namespace, so both ends check
/// each other with the kernel's peer credentials (`SO_PEERCRED`): the port
/// accepts only the users `access` lets in (by default its own user) and
/// tells the others so (`.accessDenied` at their lookup); a looker-up
/// refuses a name held by another user than the one it expects
/// (`.foreignOwner`), so a squatter learns nothing.
///
/// ## Ports in messages
///
/// A message crosses the process boundary with its bytes (a buffer of 16
/// KiB to 2 MiB, or one beyond the record's 64 KiB inline, in the sending
/// process's shared-memory ring for this port, a 4 MiB memfd it maps and
/// passes once; other buffers inline, or in a sealed memfd of their own
/// when the record is full or the ring has no room; `sharedMemoryBuffers`
/// counts the first kind; replies take the same way back, through a ring
/// the port makes for the connection) and its `.remotePort` components, each
/// passed as a descriptor (`SCM_RIGHTS`) that the receiver gets as a usable
/// `RemotePort`. `makeSendRight()` makes such a port for a `NamedPort`
/// (published or not), so a process can hand another a port to answer on.
/// A `LocalPort` cannot cross (`.notTransferable`).
///
/// ## Delivery and blocking
///
/// The port is one loop's, in the modes it is added to; its listening
/// socket and each connection are descriptor sources of that loop. The
/// handler runs on the loop's thread with one message; for a request, what
/// it returns is sent back as the reply (an empty envelope with the
/// request's id if it returns nil). A reply never waits on the loop's
/// thread: one the requester's socket does not take at once is queued on
/// its connection and sent as the socket drains, in order, so a requester
/// that stops reading holds up only itself; once `replyBacklogLimit` bytes
/// of replies wait, its next reply closes the connection (reported to
/// `onDroppedConnection` as `.replyBacklogExceeded`). A malformed or truncated message is an error on its
/// connection only: that connection is closed, counted in
/// `malformedMessages`, reported to the handlers given to
/// `onDroppedConnection(_:)`, and the others go on. A message is one sequenced
/// packet, which the kernel hands over whole or not at all, so no
/// connection ever holds part of one: unlike a `NetworkPort`, the port has
/// no stalled frames to time out.
///
/// ## Invalidation and lifetime
///
/// `invalidate()`, or the exit of the thread whose loop receives the port,
/// closes the name (lookups then throw `.nameNotFound`) and every
/// connection (their senders get `.peerGone`), and runs the handlers given
/// to `onInvalidation(_:)`. The owner's death does the same from the
/// senders' side, as soon as the kernel has released the dead process's
/// sockets: at once with the epoll backend; an io_uring ring keeps the
/// sockets it polls until its own teardown, a moment later, and a one-way
/// message sent in between is lost with the process (a request gets
/// `.peerGone`). Until then the port lives, and keeps its name,
/// even if nobody else holds it: a published name is a resource to give
/// back explicitly.
///
/// Thread-safe; `Sendable`. Misuse stops the process with a message: an
/// empty, too long or NUL-holding name; adding the port to a second loop.
public final class NamedPort: @unchecked Sendable {
    // @unchecked: `state` is guarded by `lock`; `buffer` is used only on the
    // receiving loop's thread, inside a descriptor handler, and its contents
    // are decoded before the port's handler runs (a nested run may reuse it);
    // everything else is immutable.

    /// Which users' processes a port accepts.
    public enum Access: Sendable, Hashable {
        /// Only the owner's own user (the default).
        case sameUser
        /// These users (and the owner's own).
        case users(Set<UInt32>)
        /// Anyone who can reach the name (the same network namespace).
        case anyUser

        func admits(_ uid: UInt32) -> Bool {
            switch self {
            case .sameUser: uid == PortSocketCalls.effectiveUID
            case .users(let set): uid == PortSocketCalls.effectiveUID || set.contains(uid)
            case .anyUser: true
            }
        }
    }

    /// The name it is published under; nil for an unpublished port.
    public let name: String?
    /// Which users it accepts.
    public let access: Access
    /// How many reply bytes a connection may have waiting for its
    /// requester to read before the port closes it (`.replyBacklogExceeded`).
    /// A reply is queued while fewer than this many wait, so one reply of
    /// any size always fits. A reply's bytes are its buffers' and its
    /// record's header.
    public let replyBacklogLimit: Int
    let handler: @Sendable (PortEnvelope) -> PortEnvelope?

    /// Guards `state`; never waited for in a child after `fork()` on a
    /// parent thread's account (`ForkRepairedLock`).
    private let lock = ForkRepairedLock()
    private var state = State()
    private let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: PortWire.recordCapacity, alignment: 8)
    /// Keeps the loop's modes from missing the loop's death: its `cancel`
    /// runs as the thread exits.
    private let sentinel: LoopSource
    /// Re-arms the listener after `accept` ran out of descriptors
    /// (`PortAcceptPacing`).
    private let acceptPacing: PortAcceptPacing

    private struct Connection {
        let socket: PortDescriptor
        let source: LoopSource
        /// Replies the socket did not take at once, sent as it drains.
        let replies: PortReplyOutbox<PortRecordReply>
    }

    private struct State {
        var valid = true
        var listener: (socket: PortDescriptor, source: LoopSource)?
        /// By descriptor: a connection's closes only after it leaves.
        var connections: [Int32: Connection] = [:]
        var membership = PortLoopMembership()
        var invalidationHandlers: [@Sendable (NamedPort) -> Void] = []
        var dropHandlers: [@Sendable (PortError) -> Void] = []
        var refused = 0
        var malformed = 0
        var sharedMemoryBuffers = 0
    }

    /// Publishes a port as `name` for the processes of the users `access`
    /// admits. Its messages reach `handler` once the port is added to a
    /// loop; connections made before wait for that. A connection with
    /// `replyBacklogLimit` bytes of replies or more waiting for its
    /// requester to read is closed at its next reply (4 MiB by default).
    /// Never blocks.
    ///
    /// Misuse: a `replyBacklogLimit` of zero or less is a precondition
    /// failure.
    ///
    /// - Throws: `.nameTaken` if the name is published already, with the
    ///   user and process that hold it when a probe connection can tell;
    ///   `.system` if the kernel refuses the socket.
    public init(
        name: String, access: Access = .sameUser, replyBacklogLimit: Int = 4 << 20,
        _ handler: @escaping @Sendable (PortEnvelope) -> PortEnvelope?
    ) throws(PortError) {
        PortSocketCalls.checkName(name, "NamedPort.init")
        require(replyBacklogLimit > 0, "NamedPort.init: `replyBacklogLimit` is \(replyBacklogLimit); it must be positive")
        let fd = try PortSocketCalls.listen(name)
        self.name = name
        self.access = access
        self.replyBacklogLimit = replyBacklogLimit
        self.handler = handler
        let reference = NamedPortReference()
        acceptPacing = PortAcceptPacing { reference.port?.rearmListener() }
        sentinel = Self.makeSentinel(reference)
        // The listener's source holds the port (and the port the source)
        // until invalidation: a published name is given back explicitly.
        // Re-armed by hand: not while `accept` finds no descriptor to take
        // the connection with (`PortAcceptPacing`).
        state.listener = (PortDescriptor(fd), LoopSource(descriptor: fd, rearmsManually: true) { _, _ in self.acceptWaiting() })
        reference.port = self
    }

    /// An unpublished port: reachable only through the send rights it
    /// hands out (`makeSendRight()`), e.g. as a port to answer on. Replies
    /// wait for their requesters as with a published port, up to
    /// `replyBacklogLimit` bytes per connection (4 MiB by default).
    ///
    /// Misuse: a `replyBacklogLimit` of zero or less is a precondition
    /// failure.
    public init(replyBacklogLimit: Int = 4 << 20, _ handler: @escaping @Sendable (PortEnvelope) -> PortEnvelope?) {
        require(replyBacklogLimit > 0, "NamedPort.init: `replyBacklogLimit` is \(replyBacklogLimit); it must be positive")
        name = nil
        access = .sameUser
        self.replyBacklogLimit = replyBacklogLimit
        self.handler = handler
        let reference = NamedPortReference()
        acceptPacing = PortAcceptPacing { reference.port?.rearmListener() }
        sentinel = Self.makeSentinel(reference)
        reference.port = self
    }

    /// A custom source with no work, in the port's modes: only its `cancel`
    /// matters, which runs on the exiting thread when the loop dies (a
    /// descriptor source has no such callback).
    private static func makeSentinel(_ reference: NamedPortReference) -> LoopSource {
        LoopSource(
            cancel: { loop, _ in if loop.ownerThreadHasExited { reference.port?.invalidate() } },
            perform: { _ in })
    }

    deinit {
        buffer.deallocate()
    }

    /// Whether the port still receives. Takes the port's lock briefly.
    public var isValid: Bool { lock.withLock { state.valid } }

    /// Connections refused because their process's user is not admitted.
    public var refusedConnections: Int { lock.withLock { state.refused } }

    /// Connections closed because they sent a malformed message.
    public var malformedMessages: Int { lock.withLock { state.malformed } }

    /// Byte buffers received through a sender's shared-memory ring rather
    /// than in the message or a memfd of their own (see `RemotePort`). Any
    /// thread; takes the port's short lock, never waits otherwise; stale at
    /// once, and orders nothing.
    public var sharedMemoryBuffers: Int { lock.withLock { state.sharedMemoryBuffers } }

    /// Runs `handler` each time the port closes a connection on its own
    /// account, on the thread of the loop the port is in, once the
    /// connection is closed and counted, with why:
    /// `.malformed` for a message that is truncated or does not add up, or
    /// a kind a listening port never receives (each also counted in
    /// `malformedMessages`); `.replyBacklogExceeded` for a requester that
    /// left `replyBacklogLimit` reply bytes unread; the send's error for a
    /// greeting or a reply that could not be sent. Not for a peer that closes its end (before its
    /// greeting too, as the probe of a `NamedPort.init` that finds the
    /// name taken does), nor for the
    /// port's own invalidation, nor for a refused user (counted in
    /// `refusedConnections`). Handlers run in the order added; add them
    /// Also told, once per run of failures, `.system` for an `accept` that
    /// found the process or system out of descriptors or memory: no
    /// connection closes then (it waits in the kernel's backlog), and the
    /// port stops watching its listener, retrying after a back-off of 10 ms
    /// doubling to 1 s, so it never spins (`exhaustedAccepts` counts them).
    /// before the port starts receiving to see every closing. Any thread;
    /// takes the port's lock briefly and never blocks otherwise. A handler
    /// that blocks holds up the port's loop.
    public func onDroppedConnection(_ handler: @escaping @Sendable (PortError) -> Void) {
        lock.withLock { state.dropHandlers.append(handler) }
    }

    /// How many processes (or send rights) are connected right now.
    public var connectionCount: Int { lock.withLock { state.connections.count } }

    // MARK: Loops

    /// Adds the port to `mode` of `loop` (or every common mode, for
    /// `.common`). Any thread; wakes the loop. An invalidated port is not
    /// added; a loop whose thread has exited invalidates the port.
    ///
    /// Misuse: adding it to a second loop is a precondition failure.
    public func schedule(in loop: ThreadLoop, forMode mode: LoopMode = .default) {
        let sources: [LoopSource]? = lock.withLock {
            guard state.valid else { return nil }
            return state.membership.join(loop, forMode: mode) ? allSources() : []
        }
        guard let sources else { return }
        require(!sources.isEmpty, "NamedPort.schedule(in:forMode:): the port is already received by another loop; a port is received by one loop")
        for s in sources { loop.add(s, forMode: mode) }
        loop.add(acceptPacing.timer, forMode: mode)
        if loop.ownerThreadHasExited { invalidate() }
    }

    /// Removes the port from `mode` of `loop`. Any thread.
    public func remove(from loop: ThreadLoop, forMode mode: LoopMode = .default) {
        let sources: [LoopSource] = lock.withLock {
            state.membership.leave(loop, forMode: mode) ? allSources() : []
        }
        for s in sources { loop.remove(s, forMode: mode) }
        loop.remove(acceptPacing.timer, forMode: mode)
    }

    /// The sentinel, the listener's source and the connections'. Under `lock`.
    private func allSources() -> [LoopSource] {
        var all = [sentinel]
        if let listener = state.listener { all.append(listener.source) }
        all.append(contentsOf: state.connections.values.map(\.source))
        all.append(contentsOf: state.connections.values.compactMap(\.replies.currentWriter))
        return all
    }

    /// Adds a connection's socket as a source in the port's modes (or
    /// closes it if the port is invalid); returns whether it did.
    @discardableResult
    private func adopt(_ socket: PortDescriptor) -> Bool {
        // Holds the port until the connection is dropped or the port
        // invalidated; the source holds the rings its senders introduce, so
        // they stay mapped while its handler runs, and the connection's own
        // ring for large buffers in replies.
        let rings = PortReceiveRings()
        let source = LoopSource(descriptor: socket.fd) { _, _ in self.receiveOne(on: socket, rings: rings) }
        let replies = PortReplyOutbox<PortRecordReply>(recordsOf: socket, ring: PortSendRing(), limit: replyBacklogLimit) { error in
            self.drop(socket, reason: error == .peerGone ? nil : error)
        }
        let placement: (ThreadLoop?, [LoopMode])? = lock.withLock {
            guard state.valid else { return nil }
            state.connections[socket.fd] = Connection(socket: socket, source: source, replies: replies)
            return (state.membership.loop, state.membership.currentModes)
        }
        guard let (loop, modes) = placement else {
            socket.close()
            return false
        }
        if let loop { for m in modes { loop.add(source, forMode: m) } }
        return true
    }

    /// Closes one connection (its peer gone, or misbehaving), counts it in
    /// `malformedMessages` if `malformed`, and tells the drop handlers
    /// `reason` (nil: the peer closed its end, told to nobody).
    private func drop(_ socket: PortDescriptor, malformed: Bool = false, reason: PortError? = nil) {
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
        connection.replies.close()
        connection.source.invalidate()
        socket.close()
        if let reason { for handler in handlers { handler(reason) } }
    }

    // MARK: Receiving (the loop's thread)

    /// Accepts every waiting connection: checks its user, greets it, and
    /// adds it to the loop (or refuses and closes it). `acceptPacing` runs
    /// the loop and backs off when descriptors run out.
    private func acceptWaiting() {
        guard let listener = lock.withLock({ state.listener?.socket }) else { return }
        _ = listener.use { fd in acceptPacing.acceptAll(on: fd, take: admit, report: report) }
    }

    /// A connection just accepted: refused if its user is not admitted,
    /// else adopted and greeted. Always goes on accepting.
    private func admit(_ fd: Int32) -> Bool {
        let admitted = (try? PortSocketCalls.peerUID(fd)).map(access.admits) ?? false
        guard admitted else {
            lock.withLock { state.refused += 1 }
            _ = try? PortSocketCalls.send(fd, PortWire.bare(.refused), fds: [], before: .now)
            PortSocketCalls.close(fd)
            return true
        }
        // Adopted before the greeting, so that once the peer can send,
        // an invalidation finds (and closes) its connection; which another
        // thread's invalidation may do from then on.
        let socket = PortDescriptor(fd)
        guard adopt(socket) else { return true }
        do throws(PortError) {
            _ = try socket.use { fd throws(PortError) in try PortSocketCalls.send(fd, PortWire.bare(.welcome), fds: [], before: .now) }
        } catch {
            // A peer that left before its greeting (a probe from a
            // `NamedPort.init` that found the name taken, say) closed
            // its end: told to nobody.
            drop(socket, reason: error == .peerGone ? nil : error)
        }
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

    /// Receives one message from a connection and hands it to the handler
    /// (and, for a request, sends its reply). The loop calls again while the
    /// connection stays readable: one message per call.
    private func receiveOne(on socket: PortDescriptor, rings: PortReceiveRings) {
        _ = socket.use { fd in receiveOne(on: socket, fd: fd, rings: rings) }
    }

    /// `receiveOne`, with the socket held open.
    private func receiveOne(on socket: PortDescriptor, fd: Int32, rings: PortReceiveRings) {
        switch PortSocketCalls.receive(fd, into: buffer) {
        case .nothing:
            return
        case .closed:
            drop(socket)
        case .record(let count, let fds, let truncated):
            guard !truncated else {
                PortSocketCalls.close(fds)
                drop(socket, malformed: true, reason: .malformed("a message longer than the port's buffer, cut short"))
                return
            }
            let decoded: PortWire.Decoded
            do throws(PortError) {
                decoded = try PortWire.decode(UnsafeRawBufferPointer(buffer), count: count, fds: fds, rings: rings)
                let ringed = rings.takeCount()
                if ringed > 0 { lock.withLock { state.sharedMemoryBuffers += ringed } }
            } catch {
                drop(socket, malformed: true, reason: error)
                return
            }
            switch decoded.kind {
            case .oneWay:
                _ = handler(decoded.envelope)
            case .request:
                let reply = handler(decoded.envelope) ?? PortEnvelope(id: decoded.envelope.id)
                do throws(PortError) {
                    try queueReply(PortRecordReply(envelope: reply, sequence: decoded.sequence), on: socket)
                } catch {
                    drop(socket, reason: error == .peerGone ? nil : error)
                }
            case .ring:
                // A sender's ring, mapped by the decode for its later buffers.
                break
            case .reply, .welcome, .refused:
                drop(socket, malformed: true, reason: .malformed("a \(decoded.kind) message, which a listening port never receives"))
            }
        }
    }

    /// Sends `reply` on `socket` if it takes it now, else queues it
    /// behind the connection's earlier replies, to go as the socket drains
    /// (`PortReplyOutbox`): a requester that does not read holds up only
    /// its own connection, never the loop. Throws `.replyBacklogExceeded`
    /// if `replyBacklogLimit` bytes or more wait already, and the send's
    /// error; the caller drops the connection.
    private func queueReply(_ reply: PortRecordReply, on socket: PortDescriptor) throws(PortError) {
        let replies = lock.withLock { state.connections[socket.fd].flatMap { $0.socket === socket ? $0.replies : nil } }
        guard let replies else { return }  // dropped meanwhile
        guard let writer = try replies.send(reply) else { return }
        let (loop, modes) = lock.withLock { (state.membership.loop, state.membership.currentModes) }
        if let loop { for m in modes { loop.add(writer, forMode: m) } }
    }

    // MARK: Send rights

    /// A new send right to this port, to keep or to put in a message
    /// (`.remotePort`): a connected socket pair whose one end joins the
    /// port's connections. Any thread; never blocks.
    ///
    /// - Throws: `.invalidated`; `.system` if the kernel refuses the pair.
    public func makeSendRight() throws(PortError) -> RemotePort {
        guard isValid else { throw .invalidated }
        let (mine, theirs) = try PortSocketCalls.socketPair()
        adopt(PortDescriptor(mine))
        return RemotePort(adopting: theirs, name: nil)
    }

    // MARK: Invalidation

    /// Stops the port for good: frees its name, closes every connection,
    /// leaves its loop, and runs the invalidation handlers on the calling
    /// thread. Any thread; calling it again does nothing.
    public func invalidate() {
        let taken: (listener: (socket: PortDescriptor, source: LoopSource)?, connections: [Int32: Connection], handlers: [@Sendable (NamedPort) -> Void])? =
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
        // Shut down before closing: the loop's event backend may hold the
        // sockets open until its next pass (an armed io_uring poll keeps a
        // reference), and the name and the connections must end now: a
        // shut-down listener refuses connections, a shut-down connection
        // reads as closed at the other end. Each socket the loop's thread
        // is using right now closes as that use ends (`PortDescriptor`).
        if let listener = taken.listener {
            listener.source.invalidate()
            listener.socket.close()
        }
        for connection in taken.connections.values {
            connection.replies.close()
            connection.source.invalidate()
            connection.socket.close()
        }
        for handler in taken.handlers { handler(self) }
    }

    /// Runs `handler` once when the port is invalidated, on the invalidating
    /// thread; at once if it is invalid already. Any thread.
    public func onInvalidation(_ handler: @escaping @Sendable (NamedPort) -> Void) {
        let now = lock.withLock {
            guard state.valid else { return true }
            state.invalidationHandlers.append(handler)
            return false
        }
        if now { handler(self) }
    }
}

extension ThreadLoop {
    /// Adds `port` to `mode`: see `NamedPort.schedule(in:forMode:)`.
    public func add(_ port: NamedPort, forMode mode: LoopMode = .default) {
        port.schedule(in: self, forMode: mode)
    }

    /// Removes `port` from `mode`: see `NamedPort.remove(from:forMode:)`.
    public func remove(_ port: NamedPort, forMode mode: LoopMode = .default) {
        port.remove(from: self, forMode: mode)
    }
}

private final class NamedPortReference: @unchecked Sendable {
    // @unchecked: `port` is set in the port's init, before the sentinel can
    // be added to any loop (whose lock then publishes it);
    // weak loads are safe against deallocation.
    weak var port: NamedPort?
}
