import CShims

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A thread that Spindle creates to run a closure: made with its attributes,
/// started once (`start()`), then joined for the closure's result, or
/// detached.
///
/// ```swift
/// let worker = SpawnedThread(NativeThread.Attributes(name: "indexer")) {
///     try buildIndex()           // runs on the new thread
/// }
/// try worker.start()             // throws if the attributes cannot be honoured
/// let index = try worker.join()  // the result, or the error buildIndex threw
/// ```
///
/// `NativeThread.start(_:_:)` and `NativeThread.detach(_:_:)` do the first two
/// steps at once.
///
/// **Errors.** Each thread owns its stack, so an error its body throws cannot
/// propagate to the thread that started it by itself. Spindle catches it on
/// the thread and hands it over: `join()` rethrows it; a detached thread
/// passes it to `Attributes.onDetachedError` (standard error by default). A
/// joinable thread whose `SpawnedThread` is released without a join is
/// detached then, and an error it threw is written to standard error; it is
/// never dropped without a word.
///
/// **Cost.** `start()` is one `pthread_create` (plus a `pthread_attr_t` when
/// attributes ask for a stack size, scheduling or CPUs), and this object is
/// the only allocation besides its small control block: it carries the closure
/// and, later, the result. The new thread runs the closure right away, with
/// no lock and no system call between entry and body, except when
/// `Attributes.name`, a relative priority or a NUMA node has to be applied
/// by the thread to itself.
///
/// **Misuse** stops the process with a message: starting twice, joining a
/// thread that was never started, joining a detached thread, joining twice,
/// and a thread joining itself.
public final class SpawnedThread<Value: Sendable>: NativeThread, @unchecked Sendable {
    // @unchecked, as NativeThread's conformance; the fields added here:
    // - `attributes`: immutable.
    // - `body`: written in init, taken by the new thread, which pthread_create
    //   orders after init and start().
    // - `outcome`: written by the new thread before it sets `finished` (a
    //   release); read by a joiner after pthread_join, or by deinit after an
    //   acquiring load of `finished`.
    // - `setupError`: written by the new thread before its releasing store
    //   to the setup word; read by start() after an acquiring load of it.

    /// The attributes the thread is (or will be) started with.
    public let attributes: NativeThread.Attributes

    private var body: (() throws -> Value)?
    private var outcome: Result<Value, any Error>?
    private var setupError: NativeThreadError?

    /// A thread that will run `body` once started with `attributes`. Nothing
    /// runs, and nothing is checked, until `start()`.
    public init(_ attributes: NativeThread.Attributes = NativeThread.Attributes(), _ body: sending @escaping () throws -> Value) {
        self.attributes = attributes
        self.body = body
        super.init(lifecycle: 0, tid: 0, name: attributes.name)
    }

    deinit {
        let state = AtomicMemory.load(from: lifecycleWord, ordering: .acquiring)
        guard state & Lifecycle.started != 0,
              state & (Lifecycle.joined | Lifecycle.detached) == 0 else { return }
        // Joinable, started, and now unreachable, so nobody can join it. The
        // thread has finished: it held a reference until then. Detach it so
        // that its stack goes back, and speak up about an error nobody saw.
        pthread_detach(pthread_t(AtomicMemory.load(from: pthreadWord, ordering: .acquiring)))
        if case .failure(let error)? = outcome {
            NativeThread.writeUncaught(
                error, from: "thread \(AtomicMemory.load(from: tidWord, ordering: .relaxed))"
                    + (creationName.map { " \"\($0)\"" } ?? ""),
                context: "was released without a join")
        }
    }

    // MARK: Starting

    /// Creates the kernel thread and lets it run the body.
    ///
    /// First checks the attributes (`Attributes.validate()`); then calls
    /// `pthread_create`. Returns once the thread exists, normally without
    /// waiting for it to run; with a relative priority or a NUMA node in the
    /// attributes, it waits until the thread has applied them to itself, so
    /// that a refusal is thrown here.
    ///
    /// Throws the attribute's error for a value the platform cannot honour,
    /// `permissionDenied` for a real-time policy or priority raise the kernel
    /// refuses, `cpusNotAllowed` for a CPU set the process may not use,
    /// `systemCall` (EAGAIN) at the process's or the system's thread limit.
    /// After a throw the thread has not run its body and `start()` may be
    /// called again.
    ///
    /// Memory: everything written before `start()` is visible to the body.
    /// Calling it a second time after success stops the process.
    public func start() throws(NativeThreadError) {
        let plan: LaunchPlan? = attributes.isPlatformDefault ? nil : try attributes.launchPlan()
        let initial = Lifecycle.started | (attributes.isDetached ? Lifecycle.detached : 0)
        guard AtomicMemory.compareAndSwap(expected: 0, desired: initial, at: lifecycleWord, ordering: .acquiringAndReleasing) else {
            misuse("SpawnedThread.start(): \(self) was already started; a thread runs its body once")
        }
        do throws(NativeThreadError) {
            try launch(plan)
        } catch {
            AtomicMemory.store(0, to: tidWord, ordering: .relaxed)
            AtomicMemory.store(0, to: pthreadWord, ordering: .relaxed)
            AtomicMemory.store(0, to: lifecycleWord, ordering: .releasing)
            throw error
        }
    }

    private func launch(_ plan: LaunchPlan?) throws(NativeThreadError) {
        // The new thread's reference, taken back by its entry routine.
        let argument = Unmanaged.passRetained(self as NativeThread).toOpaque()
        var thread = pthread_t()
        let rc: Int32
        if let plan, plan.needsAttributes {
            rc = SpawnedThread.create(&thread, plan, argument)
        } else {
            rc = pthread_create(&thread, nil, spawnedThreadEntry, argument)
        }
        if rc != 0 {
            Unmanaged<NativeThread>.fromOpaque(argument).release()
            throw ThreadCalls.failure(rc, .create(stackSize: plan?.stackSize, cpus: plan?.cpus, policy: plan?.policyName))
        }
        AtomicMemory.store(UInt64(thread), to: pthreadWord, ordering: .releasing)
        // The id, without a system call; if the thread has already exited
        // the thread stores it itself before it finishes.
        let tid = cshims_thread_tid(thread)
        if tid > 0 {
            _ = AtomicMemory.compareAndSwap(expected: 0, desired: tid, at: tidWord, ordering: .relaxed)
        }
        if attributes.needsSetupOnThread, !awaitSetup() {
            // The thread reported a refusal and is returning without running
            // the body; reclaim it, joinable or not, before reporting.
            let joined = pthread_join(thread, nil)
            if joined != 0 { misuse("pthread_join after a failed start: \(errnoDescription(joined))") }
            throw setupError ?? .systemCall(SystemCallError(call: "thread setup", code: EINVAL))
        }
        // Detached threads are created joinable and detached here, after the
        // id has been read from the thread's descriptor (which a detached
        // thread frees as it exits).
        if attributes.isDetached { pthread_detach(thread) }
    }

    /// `pthread_create` with a `pthread_attr_t` built from `plan`.
    private static func create(
        _ thread: inout pthread_t, _ plan: LaunchPlan, _ argument: UnsafeMutableRawPointer
    ) -> Int32 {
        var attr = pthread_attr_t()
        var rc = pthread_attr_init(&attr)
        if rc != 0 { return rc }
        defer { pthread_attr_destroy(&attr) }
        if let stackSize = plan.stackSize {
            rc = pthread_attr_setstacksize(&attr, stackSize)
            if rc != 0 { return rc }
        }
        if let (policy, priority) = plan.policy {
            rc = pthread_attr_setinheritsched(&attr, Int32(PTHREAD_EXPLICIT_SCHED))
            if rc == 0 { rc = pthread_attr_setschedpolicy(&attr, policy) }
            var parameter = sched_param()
            parameter.sched_priority = priority
            if rc == 0 { rc = pthread_attr_setschedparam(&attr, &parameter) }
            if rc != 0 { return rc }
        }
        if let cpus = plan.cpus {
            let mask = Topology.mask(of: cpus)
            rc = -cshims_thread_attr_set_affinity(&attr, mask, mask.count)
            if rc != 0 { return rc }
        }
        return pthread_create(&thread, &attr, spawnedThreadEntry, argument)
    }

    /// Waits for the new thread's verdict on the settings it applies to
    /// itself. Pairs with the releasing store in `applySetup()`.
    private func awaitSetup() -> Bool {
        let futex = Futex(setupWord)
        while true {
            let state = AtomicMemory.load(from: setupWord, ordering: .acquiring)
            if state != Setup.pending { return state == Setup.succeeded }
            _ = futex.wait(expecting: Setup.pending)
        }
    }

    // MARK: On the new thread

    override func runOnNewThread() {
        // Borrowed: the entry routine holds the reference until we return.
        pthread_setspecific(currentThreadKey, Unmanaged.passUnretained(self as NativeThread).toOpaque())
        if let name = attributes.name { ThreadCalls.setNameOfCallingThread(name) }
        if attributes.needsSetupOnThread {
            guard applySetup() else {
                pthread_setspecific(currentThreadKey, nil)
                return
            }
        }
        let result = runBody()
        let state = AtomicMemory.load(from: lifecycleWord, ordering: .relaxed)
        if state & Lifecycle.detached != 0 {
            // Nobody will join: hand an error to the handler, drop a value here.
            if case .failure(let error) = result { reportDetached(error) }
        } else {
            outcome = result
        }
        runExitDuties()
        pthread_setspecific(currentThreadKey, nil)
        if AtomicMemory.load(from: tidWord, ordering: .relaxed) == 0 {
            // The thread ended before start() read its id from the descriptor.
            _ = AtomicMemory.compareAndSwap(expected: 0, desired: cshims_gettid(), at: tidWord, ordering: .relaxed)
        }
        // Publishes `outcome`, for deinit (a joiner is ordered by pthread_join).
        AtomicMemory.or(Lifecycle.finished, into: lifecycleWord, ordering: .releasing)
    }

    /// Runs the body once and releases it (and what it captured) on this thread.
    private func runBody() -> Result<Value, any Error> {
        guard let body else { misuse("SpawnedThread: body missing on entry") }
        self.body = nil
        do {
            return .success(try body())
        } catch {
            return .failure(error)
        }
    }

    /// Applies the nice value and NUMA memory preference the thread sets on
    /// itself, and tells `start()` the verdict. Returns whether it succeeded.
    private func applySetup() -> Bool {
        var failure: NativeThreadError? = nil
        do throws(NativeThreadError) {
            if case .relative(let value)? = attributes.priority {
                try ThreadCalls.setNice(of: 0, to: Priority.niceValue(forRelative: value))
            }
            if let node = attributes.numaNode {
                try ThreadCalls.preferNode(Int32(node))
            }
        } catch {
            failure = error
        }
        setupError = failure
        // Publishes `setupError`; pairs with the acquiring load in awaitSetup().
        AtomicMemory.store(failure == nil ? Setup.succeeded : Setup.failed, to: setupWord, ordering: .releasing)
        Futex(setupWord).wake(1)
        return failure == nil
    }

    private func reportDetached(_ error: any Error) {
        if let handler = attributes.onDetachedError {
            handler(error, self)
        } else {
            NativeThread.writeUncaught(error, from: "\(self)", context: "is detached")
        }
    }

    // MARK: Joining

    /// Waits for the thread to end and returns what its body returned, or
    /// throws what it threw. Blocks the calling thread (`pthread_join(3)`).
    ///
    /// When `join()` returns, the thread has exited: its `ThreadLocal`
    /// destructors have run and its stack is given back. Memory: everything
    /// the thread wrote is visible to the caller.
    ///
    /// Stops the process when the thread was never started, is detached, has
    /// already been joined (or is being joined by another thread), or is the
    /// caller itself.
    public func join() throws -> Value {
        let thread = beginJoin("join()")
        let rc = pthread_join(thread, nil)
        if rc != 0 { misuse("SpawnedThread.join(): pthread_join on \(self) failed: \(errnoDescription(rc))") }
        return try takeOutcome()
    }

    /// Joins the thread if it ends by `deadline`; returns nil, leaving it
    /// joinable, if it is still running then. `join(until: .now)` checks
    /// without waiting. Blocks the calling thread at most until the deadline
    /// (`pthread_clockjoin_np(3)` on `CLOCK_MONOTONIC`). For a `Value` that is
    /// itself optional, tell the cases apart with `isFinished`.
    ///
    /// Same misuse rules as `join()`; in particular, two threads may not wait
    /// to join the same thread at once.
    public func join(until deadline: MonotonicClock.Instant) throws -> Value? {
        if deadline.isDistantFuture { return try join() }
        let thread = beginJoin("join(until:)")
        let rc = cshims_thread_join_until(thread, max(deadline.nanoseconds, 0))
        switch -rc {
        case 0:
            return try takeOutcome()
        case ETIMEDOUT, EBUSY:
            // Still running: joinable again.
            AtomicMemory.and(~Lifecycle.joined, into: lifecycleWord, ordering: .releasing)
            return nil
        default:
            misuse("SpawnedThread.join(until:): pthread_clockjoin_np on \(self) failed: \(errnoDescription(-rc))")
        }
    }

    /// Whether the body has returned or thrown. A finished thread may still
    /// be exiting (destroying its thread-locals); `join()` waits for that.
    /// Does not block. Memory: an acquire, pairing with the thread's release
    /// of its outcome.
    public var isFinished: Bool {
        AtomicMemory.load(from: lifecycleWord, ordering: .acquiring) & Lifecycle.finished != 0
    }

    /// Whether the thread was started (or is being started) detached.
    public var isDetached: Bool {
        AtomicMemory.load(from: lifecycleWord, ordering: .relaxed) & Lifecycle.detached != 0
    }

    /// Claims the right to join, or stops the process on misuse.
    private func beginJoin(_ api: String) -> pthread_t {
        if NativeThread.currentIfRegistered === self {
            misuse("SpawnedThread.\(api): \(self) is trying to join itself; it would wait forever for its own end")
        }
        let before = AtomicMemory.orOriginal(Lifecycle.joined, into: lifecycleWord, ordering: .acquiringAndReleasing)
        if before & Lifecycle.started == 0 {
            misuse("SpawnedThread.\(api): \(self) was never started; call start() first")
        }
        if before & Lifecycle.detached != 0 {
            misuse("SpawnedThread.\(api): \(self) is detached; a detached thread cannot be joined")
        }
        if before & Lifecycle.joined != 0 {
            misuse("SpawnedThread.\(api): \(self) was already joined (or another thread is joining it); a thread is joined once")
        }
        return pthread_t(AtomicMemory.load(from: pthreadWord, ordering: .acquiring))
    }

    /// The outcome, after pthread_join ordered the thread's writes before us.
    private func takeOutcome() throws -> Value {
        guard let result = outcome else { misuse("SpawnedThread: joined \(self) but it stored no outcome") }
        outcome = nil
        return try result.get()
    }
}

/// The entry routine of every spawned thread: takes back the reference
/// `start()` passed and runs the thread.
private func spawnedThreadEntry(_ raw: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    let thread = Unmanaged<NativeThread>.fromOpaque(raw!).takeRetainedValue()
    thread.runOnNewThread()
    return nil
}

extension NativeThread {
    /// Starts `body` on a new joinable thread with `attributes`: a
    /// `SpawnedThread` made and started in one step. See
    /// `SpawnedThread.start()` for what it throws and `join()` for the result.
    public static func start<Value: Sendable>(
        _ attributes: Attributes = Attributes(), _ body: sending @escaping () throws -> Value
    ) throws(NativeThreadError) -> SpawnedThread<Value> {
        let thread = SpawnedThread(attributes, body)
        try thread.start()
        return thread
    }

    /// Starts `body` on a new detached thread with `attributes` (whose
    /// `isDetached` is set for you). Its resources go back as soon as it
    /// ends; an error it throws goes to `attributes.onDetachedError`, or to
    /// standard error. Returns the thread, for `cancel()` or `id`; it cannot be
    /// joined. Throws as `SpawnedThread.start()` does.
    @discardableResult
    public static func detach(
        _ attributes: Attributes = Attributes(), _ body: sending @escaping () throws -> Void
    ) throws(NativeThreadError) -> NativeThread {
        var detached = attributes
        detached.isDetached = true
        let thread = SpawnedThread<Void>(detached, body)
        try thread.start()
        return thread
    }

    /// The report of an error that no handler took.
    static func writeUncaught(_ error: any Error, from thread: String, context: String) {
        writeStandardError("Spindle: \(thread) \(context), and its body threw: \(error)\n")
    }
}

/// Writes `text` to file descriptor 2 in as few `write(2)` calls as it takes.
func writeStandardError(_ text: String) {
    var text = text
    text.withUTF8 { bytes in
        var offset = 0
        while offset < bytes.count {
            let n = write(2, bytes.baseAddress! + offset, bytes.count - offset)
            if n < 0 {
                if errno == EINTR { continue }
                return
            }
            offset += n
        }
    }
}
