/// A thread that runs its own `ThreadLoop`, started in one call: the role of
/// swift-nio's event-loop thread, and of the guide's secondary thread that
/// sets up a run loop and runs it.
///
///     let worker = try LoopThread.start()               // runs worker.loop until stopped
///     worker.loop.perform { print("on the worker") }    // any thread
///     worker.stop()
///     try worker.join()
///
/// `start` returns once the new thread has made its loop and added a source
/// that keeps the loop's default mode from being empty (a loop whose mode
/// has nothing in it finishes at once instead of sleeping). So the loop can
/// be used from any thread as soon as `start` returns; what the caller did
/// before `start` is visible to the new thread (thread creation orders it),
/// and so is what the new thread did before handing over the loop (a
/// semaphore orders it).
///
/// The thread then runs `body` with its loop: by default `loop.run()`, which
/// sleeps until there is work and handles it, until `stop()`. A body of your
/// own runs the loop as it likes (in passes, between chunks of work, in other
/// modes) and decides when to return; `stop()` makes the loop's current or
/// next `run` return `.stopped`, and removes the keep-alive source, but
/// cannot make a body return that does not look.
///
/// Misuse: `join()` from the loop's own thread, or twice, stops the process
/// with `SpawnedThread.join()`'s message. A `LoopThread` that is never joined
/// leaves its thread joinable (see `SpawnedThread`).
public final class LoopThread: Sendable, CustomStringConvertible {
    /// The thread's loop. Add sources and timers to it, and `perform` on it,
    /// from any thread; only the loop's own thread runs it.
    public let loop: ThreadLoop

    /// The thread, for its identity, name and scheduling; `join()` joins it.
    public let thread: SpawnedThread<Void>

    /// Keeps the default mode from being empty; removed by `stop()`.
    let keepAlive: LoopSource

    private init(loop: ThreadLoop, thread: SpawnedThread<Void>, keepAlive: LoopSource) {
        self.loop = loop
        self.thread = thread
        self.keepAlive = keepAlive
    }

    /// Starts a joinable thread with `attributes`, makes its loop (with
    /// `backend`, or the preferred one: `SPINDLE_EVENT_BACKEND`, else
    /// io_uring, else epoll), keeps the loop's default mode alive, and runs
    /// `body` with the loop on that thread.
    ///
    /// Blocks until the new thread has made its loop (a thread start and a
    /// hand-over: tens of microseconds), not while `body` runs.
    ///
    /// The thread's kernel name (`ps`, `top`, debuggers) is `name`, else
    /// `attributes.name`, else `"LoopThread"`: an unnamed loop thread does
    /// not keep the name Linux copies from the thread that created it.
    ///
    /// - Parameters:
    ///   - attributes: The thread's attributes (name, stack size, priority,
    ///     affinity...); `isDetached` must be false, since `join()` joins it.
    ///   - name: The thread's name, at most 15 bytes of UTF-8; takes the
    ///     place of `attributes.name` when given.
    ///   - kind: The loop's event backend; `nil` for the preferred one.
    ///   - body: What the thread does with its loop; by default it runs the
    ///     loop until `stop()`. An error it throws reaches `join()`. It is
    ///     `sending`: it runs once, on the new thread, so the caller hands it
    ///     over with what it captures (the compiler rejects a capture the
    ///     caller goes on using).
    /// - Returns: The running thread and its loop.
    /// - Throws: `NativeThreadError` if the thread cannot start (see
    ///   `SpawnedThread.start()`; `.nameTooLong` for a name over 15 bytes),
    ///   or `.systemCall` with the kernel's refusal of the loop's backend
    ///   (`kind`, or the preferred one when both kinds are refused: e.g.
    ///   `EMFILE` when the process is out of descriptors); the thread has
    ///   then ended and been joined.
    @available(*, noasync, message: "blocks until the new thread has made its loop; in async code use `try await LoopThread.start(...)`")
    public static func start(
        _ attributes: NativeThread.Attributes = NativeThread.Attributes(),
        name: String? = nil,
        backend kind: EventBackendKind? = nil,
        _ body: sending @escaping (ThreadLoop) throws -> Void = { $0.run() }
    ) throws(NativeThreadError) -> LoopThread {
        require(!attributes.isDetached, "LoopThread.start: `attributes.isDetached` is true; a loop thread is joinable")
        var attributes = attributes
        attributes.name = name ?? attributes.name ?? Self.defaultName
        let handOver = LockedValue<Result<(ThreadLoop, LoopSource), SystemCallError>?>(nil)
        let ready = Semaphore(value: 0)
        let thread = try NativeThread.start(attributes) { () throws -> Void in
            let loop: ThreadLoop
            do throws(SystemCallError) {
                // The new thread has no loop yet: making it may fail (out of
                // descriptors or memory), and that reaches the caller.
                if let existing = LoopRegistry.currentLoop() {
                    loop = existing
                } else {
                    loop = try LoopRegistry.makeCurrent(throwing: kind)
                }
            } catch {
                handOver.withLock { $0 = .failure(error) }
                ready.signal()
                return
            }
            let keepAlive = LoopSource { _ in }
            loop.add(keepAlive)
            handOver.withLock { $0 = .success((loop, keepAlive)) }
            ready.signal()
            defer { keepAlive.invalidate() }
            try body(loop)
        }
        ready.wait()
        switch handOver.withLock({ $0 })! {
        case .success(let (loop, keepAlive)):
            return LoopThread(loop: loop, thread: thread, keepAlive: keepAlive)
        case .failure(let error):
            try? thread.join()
            throw .systemCall(error)
        }
    }

    /// The async form of `start(_:name:backend:_:)`: the thread is started
    /// from a pool worker while the calling task is suspended, so no
    /// cooperative thread waits for the hand-over. `body` is `@Sendable`
    /// here (it crosses to the pool worker first). Throws as the blocking
    /// form; misuse as it.
    public static func start(
        _ attributes: NativeThread.Attributes = NativeThread.Attributes(),
        name: String? = nil,
        backend kind: EventBackendKind? = nil,
        _ body: @escaping @Sendable (ThreadLoop) throws -> Void = { $0.run() }
    ) async throws(NativeThreadError) -> LoopThread {
        let started: Result<LoopThread, NativeThreadError>
        do {
            started = try await WorkQueue.global().performReturning {
                Result { () throws(NativeThreadError) -> LoopThread in
                    try LoopThread.start(attributes, name: name, backend: kind, body)
                }
            }
        } catch {
            misuse("LoopThread.start: the pool worker that starts the thread threw \(error), which it never does")
        }
        return try started.get()
    }

    /// The async form of `join()`: suspends the calling task until the
    /// thread has ended (see `SpawnedThread`'s async `join()`), and rethrows
    /// what its body threw.
    public func join() async throws {
        try await thread.join()
    }

    /// The kernel name of a loop thread started without one.
    public static let defaultName = "LoopThread"

    /// Asks the thread to stop: removes the keep-alive source and makes the
    /// loop's current `run` (or its next one) return `.stopped`, which ends
    /// the default body. Any thread; never blocks (a wake-up system call if
    /// the loop sleeps). Calling it again does nothing more.
    public func stop() {
        keepAlive.invalidate()
        loop.stop()
    }

    /// Waits for the thread to end and rethrows what its body threw. Blocks.
    /// Everything the thread did is visible to the caller afterwards. Call
    /// `stop()` first unless the body returns on its own.
    @available(*, noasync, message: "blocks the thread until the loop thread ends; in async code use `try await join()`")
    public func join() throws {
        try thread.join()
    }

    /// `LoopThread(` the thread's description `)`.
    public var description: String { "LoopThread(\(thread))" }
}
