import CShims
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A thread that Spindle creates to run a closure: made with its attributes,
/// started once (`start()`), then joined for the closure's result, or
/// detached.
///
/// Replaces Foundation's `Thread(block:)` (adding a join), and
/// `pthread_create` with `pthread_join`.
///
/// ```swift
/// let worker = SpawnedThread(NativeThread.Attributes(name: "indexer")) {
///     try buildIndex()           // runs on the new thread
/// }
/// try worker.start()             // throws if the attributes cannot be honoured
/// let index = try worker.join()  // the result, or the error buildIndex threw
/// ```
///
/// `NativeThread.start(_:)`, `start(_:_:)` and `NativeThread.detach(_:_:)` do the first two
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
/// attributes ask for a stack size, scheduling or CPUs). With the platform's
/// default attributes this object is the only allocation: it carries the
/// closure and, later, the result (held inline when it fits in 16 bytes).
/// The new thread runs the closure right away, with no lock, no allocation
/// and no system call between entry and body, except when `Attributes.name`,
/// a relative priority or a NUMA node has to be applied by the thread to
/// itself.
///
/// **Misuse** stops the process with a message: starting twice, joining a
/// thread that was never started, joining a detached thread, joining twice,
/// and a thread joining itself.
public final class SpawnedThread<Value: Sendable>: NativeThread, @unchecked Sendable {
    // @unchecked, as NativeThread's conformance; the fields added here:
    // - `custom`: immutable.
    // - `body`: written in init, taken by the new thread, which pthread_create
    //   orders after init and start().
    // - The outcome (`outcome`, `thrown`, `inlineValue`, `heapValue`):
    //   written by the new thread before it sets `finished` (a release);
    //   read by a joiner after pthread_join, or by deinit after an acquiring
    //   load of `finished`.
    //
    // None of the stored properties has a type built from `Value` (such as
    // `Result<Value, Error>?`): unspecialized code would have to look up that
    // type's metadata on every start and deinit, which measurably slowed
    // thread creation. The value is kept in raw storage of `Value`'s layout.

    /// Attributes other than the platform's defaults, with their launch
    /// state; nil on the fast path.
    private let custom: CustomLaunch?
    @exclusivity(unchecked) private var body: (() throws -> Value)?
    private var outcome = Outcome.none
    private var thrown: (any Error)?
    /// The value when it fits (`storesInline`), else `heapValue`.
    private var inlineValue: (UInt64, UInt64) = (0, 0)
    private var heapValue: UnsafeMutableRawPointer?

    private enum Outcome: UInt8 {
        case none, value, error, taken
    }

    /// A thread that will run `body` with the platform's default attributes
    /// (joinable, inherited scheduling and CPUs, the default stack) once
    /// started. Nothing runs until `start()`.
    public init(_ body: sending @escaping () throws -> Value) {
        custom = nil
        self.body = body
        super.init(lifecycle: 0, tid: 0)
    }

    /// A thread that will run `body` with `attributes` once started. Nothing
    /// runs, and nothing is checked, until `start()`.
    public init(_ attributes: NativeThread.Attributes, _ body: sending @escaping () throws -> Value) {
        let plain = attributes.isPlatformDefault && !attributes.isDetached && attributes.onDetachedError == nil
        custom = plain ? nil : CustomLaunch(attributes)
        self.body = body
        super.init(lifecycle: 0, tid: 0)
    }

    deinit {
        let state = lifecycle.load(ordering: .acquiring)
        if state & Lifecycle.started != 0, state & (Lifecycle.joined | Lifecycle.detached) == 0 {
            // Joinable, started, and now unreachable, so nobody can join it.
            // The thread has finished: it held a reference until then. Detach
            // it so that its stack goes back, and speak up about an error
            // nobody saw.
            pthread_detach(pthread_t(pthread.load(ordering: .acquiring)))
            if outcome == .error, let thrown {
                NativeThread.writeUncaught(
                    thrown, from: "thread \(tid.load(ordering: .relaxed))" + (creationName.map { " \"\($0)\"" } ?? ""),
                    context: "was released without a join")
            }
        }
        if outcome == .value { destroyValue() }
    }

    /// The attributes the thread is (or will be) started with.
    public var attributes: NativeThread.Attributes { custom?.attributes ?? NativeThread.Attributes() }

    override var creationName: String? { custom?.attributes.name }

    // MARK: Starting

    /// Creates the kernel thread and lets it run the body.
    ///
    /// First checks the attributes (`Attributes.validate()`); then calls
    /// `pthread_create`. Returns once the thread exists, normally without
    /// waiting for it to run; with a relative priority or a NUMA node in the
    /// attributes, it waits until the thread has applied them to itself, so
    /// that a refusal is thrown here; with a name, it waits until the thread
    /// has taken it, so that `name` reads it from the moment `start()`
    /// returns.
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
        var plan: LaunchPlan? = nil
        if let custom, !custom.attributes.isPlatformDefault {
            plan = try custom.attributes.launchPlan()
        }
        let detached = custom?.attributes.isDetached ?? false
        let initial = Lifecycle.started | (detached ? Lifecycle.detached : 0)
        guard lifecycle.compareExchange(expected: 0, desired: initial, ordering: .acquiringAndReleasing).exchanged else {
            misuse("SpawnedThread.start(): \(self) was already started; a thread runs its body once")
        }
        do throws(NativeThreadError) {
            try launch(plan, detached: detached)
        } catch {
            tid.store(0, ordering: .relaxed)
            pthread.store(0, ordering: .relaxed)
            lifecycle.store(0, ordering: .releasing)
            throw error
        }
    }

    private func launch(_ plan: LaunchPlan?, detached: Bool) throws(NativeThreadError) {
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
        pthread.store(UInt(thread), ordering: .releasing)
        // The id, from the new thread's descriptor, without a system call
        // (the kernel wrote it there during clone). If the thread has already
        // exited, it stores the id itself before it finishes.
        let id = cshims_thread_tid(thread)
        if id > 0 { _ = tid.compareExchange(expected: 0, desired: id, ordering: .relaxed) }
        if let custom, custom.needsSetup, !custom.awaitSetup() {
            // The thread reported a refusal and is returning without running
            // the body; reclaim it, joinable or not, before reporting.
            let joined = pthread_join(thread, nil)
            if joined != 0 { misuse("pthread_join after a failed start: \(errnoDescription(joined))") }
            throw custom.setupError ?? .systemCall(SystemCallError(call: "thread setup", code: EINVAL))
        }
        // Detached threads are created joinable and detached here, after the
        // id has been read from the thread's descriptor (which a detached
        // thread frees as it exits).
        if detached { pthread_detach(thread) }
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

    // MARK: On the new thread

    override func runOnNewThread() {
        // Borrowed: the entry routine holds the reference until we return.
        cshims_set_current_thread(Unmanaged.passUnretained(self as NativeThread).toOpaque())
        if let custom {
            if let name = custom.attributes.name { ThreadCalls.setNameOfCallingThread(name) }
            if custom.needsSetup, !custom.applySetup() {
                cshims_set_current_thread(nil)
                return
            }
        }
        runBody()
        runExitDuties()
        cshims_set_current_thread(nil)
        if tid.load(ordering: .relaxed) == 0 {
            // The thread ended before start() read its id: read it from our
            // own descriptor.
            let own = cshims_thread_tid(pthread_self())
            _ = tid.compareExchange(expected: 0, desired: own > 0 ? own : cshims_gettid(), ordering: .relaxed)
        }
        // Publishes the outcome, for deinit (a joiner is ordered by pthread_join).
        lifecycle.bitwiseOr(Lifecycle.finished, ordering: .releasing)
    }

    /// Runs the body once, keeps its outcome (or, detached, reports an error
    /// and drops a value), and releases the body and what it captured on
    /// this thread.
    private func runBody() {
        // A load and a store, not `Optional.take()`: that generic call would
        // need the closure type's metadata, a lookup on every start.
        guard let body = self.body else { misuse("SpawnedThread: body missing on entry") }
        self.body = nil
        // `detached` is read after the body, so that the way in touches as
        // little as possible (the bit was set before pthread_create). No
        // `Result<Value, Error>` here: see the note on the stored properties.
        do {
            let value = try body()
            if lifecycle.load(ordering: .relaxed) & Lifecycle.detached == 0 {
                storeValue(value)
                outcome = .value
            }
        } catch {
            if lifecycle.load(ordering: .relaxed) & Lifecycle.detached != 0 {
                reportDetached(error)
            } else {
                thrown = error
                outcome = .error
            }
        }
    }

    private func reportDetached(_ error: any Error) {
        if let handler = custom?.attributes.onDetachedError {
            handler(error, self)
        } else {
            NativeThread.writeUncaught(error, from: "\(self)", context: "is detached")
        }
    }

    // MARK: The value, in raw storage

    /// Whether a `Value` fits in `inlineValue`.
    private static var storesInline: Bool {
        MemoryLayout<Value>.size <= MemoryLayout<(UInt64, UInt64)>.size
            && MemoryLayout<Value>.alignment <= MemoryLayout<(UInt64, UInt64)>.alignment
    }

    private func storeValue(_ value: Value) {
        if SpawnedThread.storesInline {
            withUnsafeMutableBytes(of: &inlineValue) { bytes in
                bytes.baseAddress!.bindMemory(to: Value.self, capacity: 1).initialize(to: value)
            }
        } else {
            let storage = UnsafeMutablePointer<Value>.allocate(capacity: 1)
            storage.initialize(to: value)
            heapValue = UnsafeMutableRawPointer(storage)
        }
    }

    private func takeValue() -> Value {
        if SpawnedThread.storesInline {
            return withUnsafeMutableBytes(of: &inlineValue) { bytes in
                bytes.baseAddress!.assumingMemoryBound(to: Value.self).move()
            }
        }
        let storage = heapValue!.assumingMemoryBound(to: Value.self)
        heapValue = nil
        defer { storage.deallocate() }
        return storage.move()
    }

    private func destroyValue() {
        if SpawnedThread.storesInline {
            withUnsafeMutableBytes(of: &inlineValue) { bytes in
                _ = bytes.baseAddress!.assumingMemoryBound(to: Value.self).deinitialize(count: 1)
            }
        } else if let heapValue {
            let storage = heapValue.assumingMemoryBound(to: Value.self)
            storage.deinitialize(count: 1)
            storage.deallocate()
            self.heapValue = nil
        }
        outcome = .taken
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
    @available(*, noasync, message: "blocks the thread; in async code use `try await join()`")
    public func join() throws -> Value {
        let thread = beginJoin("join()")
        let rc = announcingBlocking { pthread_join(thread, nil) }
        if rc != 0 { misuse("SpawnedThread.join(): pthread_join on \(self) failed: \(errnoDescription(rc))") }
        return try takeOutcome()
    }

    /// Joins the thread if it ends by `deadline`; returns nil, leaving it
    /// joinable, if it is still running then. `join(until: .now)` checks
    /// without waiting. Blocks the calling thread at most until the deadline
    /// (`pthread_timedjoin_np(3)`, in slices of at most 50 ms converted from
    /// `CLOCK_MONOTONIC`, so that a wall-clock jump delays the return by at
    /// most one slice; glibc's `pthread_clockjoin_np` would be exact, but
    /// ThreadSanitizer does not know it). For a `Value` that is
    /// itself optional, tell the cases apart with `isFinished`.
    ///
    /// Same misuse rules as `join()`; in particular, two threads may not wait
    /// to join the same thread at once.
    @available(*, noasync, message: "blocks the thread; in async code use `try await join()`")
    public func join(until deadline: MonotonicClock.Instant) throws -> Value? {
        if deadline.isDistantFuture { return try join() }
        let thread = beginJoin("join(until:)")
        let rc = announcingBlocking { cshims_thread_join_until(thread, max(deadline.nanoseconds, 0)) }
        switch -rc {
        case 0:
            return try takeOutcome()
        case ETIMEDOUT, EBUSY:
            // Still running: joinable again.
            lifecycle.bitwiseAnd(~Lifecycle.joined, ordering: .releasing)
            return nil
        default:
            misuse("SpawnedThread.join(until:): pthread_timedjoin_np on \(self) failed: \(errnoDescription(-rc))")
        }
    }

    /// Whether the thread was started (or is being started) detached.
    public var isDetached: Bool {
        lifecycle.load(ordering: .relaxed) & Lifecycle.detached != 0
    }

    /// Claims the right to join, or stops the process on misuse.
    private func beginJoin(_ api: String) -> pthread_t {
        if NativeThread.currentIfRegistered === self {
            misuse("SpawnedThread.\(api): \(self) is trying to join itself; it would wait forever for its own end")
        }
        let before = lifecycle.bitwiseOr(Lifecycle.joined, ordering: .acquiringAndReleasing).oldValue
        if before & Lifecycle.started == 0 {
            misuse("SpawnedThread.\(api): \(self) was never started; call start() first")
        }
        if before & Lifecycle.detached != 0 {
            misuse("SpawnedThread.\(api): \(self) is detached; a detached thread cannot be joined")
        }
        if before & Lifecycle.joined != 0 {
            misuse("SpawnedThread.\(api): \(self) was already joined (or another thread is joining it); a thread is joined once")
        }
        return pthread_t(pthread.load(ordering: .acquiring))
    }

    /// The outcome, after pthread_join ordered the thread's writes before us.
    private func takeOutcome() throws -> Value {
        switch outcome {
        case .value:
            outcome = .taken
            return takeValue()
        case .error:
            outcome = .taken
            let error = thrown!
            thrown = nil
            throw error
        case .none, .taken:
            misuse("SpawnedThread: joined \(self) but it stored no outcome")
        }
    }
}

/// Attributes other than the defaults, and the state of the settings a new
/// thread applies to itself.
final class CustomLaunch: @unchecked Sendable {
    // @unchecked: `attributes`, `needsSetup` and `setupWord` are immutable;
    // `setupError` is written by the new thread before its releasing store
    // to the setup word, and read by start() after an acquiring load of it.
    let attributes: NativeThread.Attributes
    let needsSetup: Bool
    /// The futex start() waits on for the verdict: `Setup` values.
    let setupWord: UnsafeMutablePointer<UInt32>?
    var setupError: NativeThreadError?

    enum Setup {
        static let pending: UInt32 = 0
        static let succeeded: UInt32 = 1
        static let failed: UInt32 = 2
    }

    init(_ attributes: NativeThread.Attributes) {
        self.attributes = attributes
        needsSetup = attributes.needsSetupOnThread
        if needsSetup {
            let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
            word.initialize(to: Setup.pending)
            setupWord = word
        } else {
            setupWord = nil
        }
    }

    deinit { setupWord?.deallocate() }

    /// On the new thread: applies the nice value and NUMA memory preference,
    /// and tells `start()` the verdict. Returns whether it succeeded.
    func applySetup() -> Bool {
        var failure: NativeThreadError? = nil
        do throws(NativeThreadError) {
            if case .relative(let value)? = attributes.priority {
                try ThreadCalls.setNice(of: 0, to: NativeThread.Priority.niceValue(forRelative: value))
            }
            if let node = attributes.numaNode {
                try ThreadCalls.preferNode(Int32(node))
            }
        } catch {
            failure = error
        }
        setupError = failure
        // Publishes `setupError`; pairs with the acquiring load in awaitSetup().
        AtomicMemory.store(failure == nil ? Setup.succeeded : Setup.failed, to: setupWord!, ordering: .releasing)
        Futex(setupWord!).wake(1)
        return failure == nil
    }

    /// On the starter: waits for the new thread's verdict.
    func awaitSetup() -> Bool {
        let futex = Futex(setupWord!)
        while true {
            let state = AtomicMemory.load(from: setupWord!, ordering: .acquiring)
            if state != Setup.pending { return state == Setup.succeeded }
            _ = futex.wait(expecting: Setup.pending)
        }
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
    /// Starts `body` on a new joinable thread with the platform's default
    /// attributes: a `SpawnedThread` made and started in one step. See
    /// `SpawnedThread.start()` for what it throws and `join()` for the result.
    public static func start<Value: Sendable>(
        _ body: sending @escaping () throws -> Value
    ) throws(NativeThreadError) -> SpawnedThread<Value> {
        let thread = SpawnedThread(body)
        try thread.start()
        return thread
    }

    /// Starts `body` on a new thread with `attributes` (joinable unless they
    /// say otherwise): a `SpawnedThread` made and started in one step.
    public static func start<Value: Sendable>(
        _ attributes: Attributes, _ body: sending @escaping () throws -> Value
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
        // (Detached threads always carry their attributes; the default
        // argument costs nothing next to the allocation that needs.)
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
