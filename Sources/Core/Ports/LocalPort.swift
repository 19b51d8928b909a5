import CShims

/// An in-process port: the guide's Mach port between threads (Foundation's
/// `NSMachPort`, which Linux lacks). Any thread sends it messages
/// (`PortEnvelope`); the thread whose `ThreadLoop` it was added to receives
/// them, one per call of the port's handler.
///
/// The guide's check-in, in short (the launcher's loop receives on
/// `launcherPort`; the worker answers with a port of its own):
///
///     // Launcher thread
///     let launcherPort = LocalPort { message in
///         if message.id == 100, let worker = message.replyPort { workers.withLock { $0.append(worker) } }
///     }
///     ThreadLoop.current.add(launcherPort)
///     // ... start the worker, handing it `launcherPort` ...
///
///     // Worker thread
///     let workerPort = LocalPort { message in /* work requests */ }
///     ThreadLoop.current.add(workerPort)
///     try launcherPort.send(PortEnvelope(id: 100, replyPort: workerPort), timeout: .zero)
///     ThreadLoop.current.run()
///
/// ## Delivery
///
/// - The port is received by one loop: the first one it is added to
///   (`ThreadLoop.add(_:forMode:)` or `schedule(in:forMode:)`), in as many
///   of that loop's modes as it is added to. A message that arrives while
///   the loop runs in another mode waits for a pass in one of the port's
///   modes.
/// - One message per handler call, in the order each sender sent them
///   (messages from different senders interleave in the order their sends
///   took the port's lock). A handled message counts as a handled source, so
///   `run(mode:timeout:returnAfterSourceHandled: true)` returns after one.
/// - Nothing is copied: the receiver gets the sender's byte buffers and
///   port objects.
/// - The port rides on a custom `LoopSource` that the sending thread
///   signals: a loop with no descriptors keeps sleeping on its futex, and a
///   send wakes it with one futex wake only when it sleeps (none when it
///   is awake or still spinning before its sleep).
///
/// ## Blocking
///
/// The queue holds at most `capacity` messages. A send to a full queue
/// waits, on a futex, until the loop takes one or the send's deadline
/// passes (`PortError.timedOut`); with a zero timeout it never waits. A
/// send from the receiving loop's own thread (a handler answering itself)
/// never waits: on a full queue it throws `PortError.fullQueueOnItsOwnLoop`
/// at once, as `WorkQueue.sync` refuses a sync onto its own queue. The
/// handler runs on the loop's thread and blocks only that loop.
///
/// ## Invalidation
///
/// `invalidate()`, or the exit of the thread whose loop receives the port,
/// stops the port for good: it leaves its loop, messages still queued are
/// dropped, sends waiting for room and every later send throw
/// `PortError.invalidated`, and the handlers given to
/// `onInvalidation(_:)` run once, on the thread that invalidated it (the
/// exiting thread, for a loop's death).
///
/// ## Lifetime
///
/// While it is in a loop, the loop keeps the port alive, as the guide's
/// run-loop sources are: a thread may add a port and drop its own
/// reference. Removed from its last mode, or invalidated, the port lives as
/// long as someone holds it (a sender, an envelope's `replyPort`).
///
/// ## Memory and thread safety
///
/// Every method may be called from any thread. A send orders like a
/// release and the delivery like an acquire (the port's lock): what the
/// sender wrote before sending is visible to the handler.
///
/// Misuse stops the process with a message: a capacity below 1, adding the
/// port to a second loop.
public final class LocalPort: @unchecked Sendable {
    // @unchecked: `state` is guarded by `lock`; `capacity`, `handler` and
    // `source` are immutable; the handler is `@Sendable`.

    /// The most messages the port holds before a send has to wait.
    public let capacity: Int
    let handler: @Sendable (PortEnvelope) -> Void
    /// The loop source that delivers the port's messages; signalled by a
    /// send that finds the queue empty and by a delivery that leaves some.
    let source: LoopSource
    /// Guards `state`; held briefly, never while calling out.
    private let lock = Lock()
    /// Broadcast when the queue has room again or the port is invalidated,
    /// for senders waiting on a full queue. Paired with `lock`.
    private let roomOrInvalid = ConditionVariable()
    private var state = State()

    private struct State {
        var valid = true
        var queue = EnvelopeQueue()
        /// Senders waiting for room: a delivery broadcasts only if there are.
        var waitingSenders = 0
        /// The loop that receives the port, once added to one.
        var claimedLoop: ObjectIdentifier?
        /// That loop's thread (`ThreadLoop.ownerThreadID`): a send from it
        /// to a full queue would wait for itself.
        var receivingThread: Int32?
        /// How many of the loop's modes hold the port's source; while any
        /// does, `keepAlive` holds the port (the loop keeps it alive).
        var scheduledModes = 0
        var keepAlive: LocalPort?
        var invalidationHandlers: [@Sendable (LocalPort) -> Void] = []
    }

    /// A port whose messages `handler` receives, on the thread of the loop
    /// the port is added to, one message per call, with the envelope's
    /// `receivePort` set to this port.
    ///
    /// - Parameters:
    ///   - capacity: How many messages may wait for the loop before a send
    ///     has to wait for room. At least 1; 1,024 by default (a queue of
    ///     that many pending messages means the receiver is behind, and a
    ///     sender should learn it from its timeout rather than fill memory).
    ///   - handler: Runs on the receiving loop's thread. `@Sendable`: it is
    ///     made on one thread and runs on another.
    public init(capacity: Int = 1024, _ handler: @escaping @Sendable (PortEnvelope) -> Void) {
        require(capacity >= 1, "LocalPort.init: `capacity` is \(capacity); a port must hold at least one message")
        self.capacity = capacity
        self.handler = handler
        // The source reaches the port weakly: the port holds the source, and
        // the port holds itself while a loop holds the source (`keepAlive`).
        let reference = PortReference()
        source = LoopSource(
            schedule: { loop, _ in reference.port?.joinedMode(of: loop) },
            cancel: { loop, _ in reference.port?.leftMode(of: loop) },
            perform: { _ in reference.port?.deliverOne() })
        // Before the source is reachable from any loop: the loop's lock,
        // taken when the source is added, publishes it.
        reference.port = self
    }

    deinit {
        // Not in any loop (it would be kept alive): nothing to remove; the
        // invalidation only stops a source that nobody can reach any more.
        source.invalidate()
    }

    /// Whether the port still takes messages. Takes the port's lock briefly.
    public var isValid: Bool { lock.withLock { state.valid } }

    /// How many messages wait for the loop. Takes the port's lock briefly;
    /// a snapshot.
    public var queuedCount: Int { lock.withLock { state.queue.count } }

    // MARK: Sending

    /// Queues `message` for the port's loop, waiting at most `timeout` for
    /// room if the queue is full (`.zero`: never wait). Any thread.
    ///
    /// - Throws: `PortError.messageTooLarge` or `.tooManyComponents` if the
    ///   envelope is over its limits (checked first); `.invalidated` if the
    ///   port is or becomes invalid before the message is queued;
    ///   `.timedOut` if the queue stayed full;
    ///   `.fullQueueOnItsOwnLoop` at once, without waiting, if the queue is
    ///   full and the caller is the thread of the loop that receives the
    ///   port (its handler sending to its own port, say): only that thread
    ///   makes room, so the wait would never end before the deadline. Nothing
    ///   is queued when it throws.
    @available(*, noasync, message: "waits for room in the port's queue; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public func send(_ message: PortEnvelope, timeout: Duration) throws(PortError) {
        require(timeout >= .zero, "LocalPort.send: `timeout` is \(timeout); it cannot be negative")
        try send(message, before: MonotonicClock.now.advanced(by: timeout))
    }

    /// As `send(_:timeout:)`, waiting for room until `deadline` on the
    /// monotonic clock (`.distantFuture`: as long as it takes).
    @available(*, noasync, message: "waits for room in the port's queue; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public func send(_ message: PortEnvelope, before deadline: MonotonicClock.Instant) throws(PortError) {
        try message.checkLimits()
        let start = MonotonicClock.now
        lock.lock()
        while true {
            guard state.valid else {
                lock.unlock()
                throw .invalidated
            }
            if state.queue.count < capacity {
                state.queue.push(message)
                let wasEmpty = state.queue.count == 1
                lock.unlock()
                // A queue that was not empty has a signal pending already, or
                // a delivery in progress that will see this message and
                // signal again (it decides under the same lock).
                if wasEmpty { source.signal() }
                return
            }
            if MonotonicClock.now >= deadline {
                lock.unlock()
                throw .timedOut(after: MonotonicClock.now - start)
            }
            // Only the receiving loop's thread makes room: waiting on that
            // thread (its handler sending to its own port, say) would hold
            // the loop for the whole timeout, or for ever.
            if let receiver = state.receivingThread, receiver == cshims_gettid() {
                lock.unlock()
                throw .fullQueueOnItsOwnLoop(capacity: capacity)
            }
            state.waitingSenders += 1
            _ = roomOrInvalid.wait(releasing: lock, until: deadline)
            state.waitingSenders -= 1
        }
    }

    // MARK: Delivery (the loop's thread)

    /// Takes the oldest message and hands it to the handler; if more are
    /// queued, signals the source again so the next pass takes the next one.
    private func deliverOne() {
        lock.lock()
        guard state.valid, var message = state.queue.pop() else {
            lock.unlock()
            return
        }
        let more = state.queue.count > 0
        let wakeSenders = state.waitingSenders > 0
        lock.unlock()
        if wakeSenders { roomOrInvalid.broadcast() }
        if more { source.signal() }
        message.receivePort = self
        handler(message)
    }

    // MARK: Loops

    /// Adds the port to `mode` of `loop` (or to every common mode, for
    /// `.common`), as `ThreadLoop.add(_:forMode:)` does. Any thread; wakes
    /// the loop. Adding it to a mode it is in does nothing; an invalidated
    /// port is not added. Adding it to a loop whose thread has exited
    /// invalidates the port (that loop will never deliver).
    ///
    /// Misuse: adding it to a second loop is a precondition failure; a port
    /// is received by one thread.
    public func schedule(in loop: ThreadLoop, forMode mode: LoopMode = .default) {
        let mine = lock.withLock {
            if state.claimedLoop == nil {
                state.claimedLoop = ObjectIdentifier(loop)
                state.receivingThread = loop.ownerThreadID
            }
            return state.claimedLoop == ObjectIdentifier(loop)
        }
        require(mine, "LocalPort.schedule(in:forMode:): the port is already received by another loop; a port is received by one loop")
        loop.add(source, forMode: mode)
        if loop.ownerThreadHasExited { invalidate() }
    }

    /// Removes the port from `mode` of `loop` (or from `.common` and every
    /// common mode); messages stay queued for when it is added again. Any
    /// thread. Removing it from a mode it is not in does nothing.
    public func remove(from loop: ThreadLoop, forMode mode: LoopMode = .default) {
        loop.remove(source, forMode: mode)
    }

    /// The source joined one of `loop`'s modes.
    private func joinedMode(of loop: ThreadLoop) {
        lock.withLock {
            state.scheduledModes += 1
            if state.valid { state.keepAlive = self }
        }
    }

    /// The source left one of `loop`'s modes: removed, invalidated, or the
    /// loop's thread exited (which invalidates the port).
    private func leftMode(of loop: ThreadLoop) {
        let released: LocalPort? = lock.withLock {
            state.scheduledModes -= 1
            guard state.scheduledModes <= 0 else { return nil }
            state.scheduledModes = 0
            defer { state.keepAlive = nil }
            return state.keepAlive
        }
        if loop.ownerThreadHasExited { invalidate() }
        // Released here, outside the lock (it may be the last reference).
        _ = released
    }

    // MARK: Invalidation

    /// Stops the port for good: it leaves its loop, queued messages are
    /// dropped, waiting and later sends throw `PortError.invalidated`, and
    /// the invalidation handlers run, on the calling thread. Any thread;
    /// takes the port's lock, then the loop's, never both at once. Calling
    /// it again does nothing.
    public func invalidate() {
        let taken: (handlers: [@Sendable (LocalPort) -> Void], dropped: EnvelopeQueue)? = lock.withLock {
            guard state.valid else { return nil }
            state.valid = false
            defer {
                state.invalidationHandlers = []
                state.queue = EnvelopeQueue()
            }
            return (state.invalidationHandlers, state.queue)
        }
        guard let taken else { return }
        roomOrInvalid.broadcast()
        source.invalidate()
        let kept = lock.withLock {
            defer { state.keepAlive = nil }
            return state.keepAlive
        }
        for handler in taken.handlers { handler(self) }
        // The dropped messages (and the ports they hold) and the port's hold
        // on itself go last, outside the lock.
        _ = (taken.dropped, kept)
    }

    /// Runs `handler` once when the port is invalidated, on the thread that
    /// invalidates it (for the death of the loop's thread, that thread as it
    /// exits); at once, on the calling thread, if it is invalid already.
    /// Handlers run in the order given. Any thread.
    public func onInvalidation(_ handler: @escaping @Sendable (LocalPort) -> Void) {
        let now = lock.withLock {
            guard state.valid else { return true }
            state.invalidationHandlers.append(handler)
            return false
        }
        if now { handler(self) }
    }
}

extension ThreadLoop {
    /// Adds `port` to `mode` (the guide's adding a port to a run loop,
    /// which makes its input source): see `LocalPort.schedule(in:forMode:)`.
    public func add(_ port: LocalPort, forMode mode: LoopMode = .default) {
        port.schedule(in: self, forMode: mode)
    }

    /// Removes `port` from `mode`: see `LocalPort.remove(from:forMode:)`.
    public func remove(_ port: LocalPort, forMode mode: LoopMode = .default) {
        port.remove(from: self, forMode: mode)
    }

    /// Whether `port` is in `mode`. Takes the loop's lock briefly.
    public func contains(_ port: LocalPort, inMode mode: LoopMode) -> Bool {
        contains(port.source, inMode: mode)
    }
}

/// The source's way to its port: weak, so that the port and its source do
/// not keep each other alive.
private final class PortReference: @unchecked Sendable {
    // @unchecked: `port` is written once, in the port's init, before the
    // source can run on any thread (adding the source to a loop takes the
    // loop's lock, which publishes it); afterwards it is only read, and weak
    // loads are safe against the port's deallocation.
    weak var port: LocalPort?
}

/// A first-in, first-out queue of envelopes in a ring that grows by
/// doubling (up to the port's capacity, which `send` enforces). Popped slots
/// are cleared at once, so a delivered message holds nothing alive.
struct EnvelopeQueue {
    private var slots: [PortEnvelope?] = []
    private var head = 0
    private(set) var count = 0

    mutating func push(_ envelope: PortEnvelope) {
        if count == slots.count { grow() }
        var tail = head + count
        if tail >= slots.count { tail -= slots.count }
        slots[tail] = envelope
        count += 1
    }

    mutating func pop() -> PortEnvelope? {
        guard count > 0 else { return nil }
        let envelope = slots[head].take()
        head += 1
        if head == slots.count { head = 0 }
        count -= 1
        return envelope
    }

    private mutating func grow() {
        var bigger = [PortEnvelope?](repeating: nil, count: max(8, slots.count * 2))
        for i in 0..<count {
            var j = head + i
            if j >= slots.count { j -= slots.count }
            bigger[i] = slots[j].take()
        }
        slots = bigger
        head = 0
    }
}
