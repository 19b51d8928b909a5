import CShims
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A kernel thread of this process: one that Spindle started (a
/// `SpawnedThread`), or any other (the main thread, a Dispatch worker, a
/// thread made with `pthread_create`), which Spindle registers the first time
/// it asks for `NativeThread.current`.
///
/// Replaces Foundation's `Thread` and pthread's `pthread_t`.
///
/// ```swift
/// let attributes = NativeThread.Attributes(name: "scanner", affinity: [Topology.onlineCPUs[0]])
/// let scanner = try NativeThread.start(attributes) {
///     var rounds = 0
///     while !NativeThread.current.isCancelled {  // stops where it chooses
///         rounds += 1                            // ... a chunk of work ...
///     }
///     return rounds
/// }
/// scanner.cancel()                               // a request, not a kill
/// let rounds = try scanner.join()
/// ```
///
/// A `NativeThread` gives a thread's identity (`id`, `name`, `isMainThread`),
/// its state (`isExecuting`, `isFinished`), cooperative cancellation (`cancel()`, `isCancelled`, a `sleep` that
/// cancellation cuts short), its per-thread storage (`threadDictionary`, and
/// `ThreadLocal` values), and control of where and how it runs (`setAffinity`,
/// `setPriority`, `bindToNUMANode`).
///
/// To start a thread, make a `SpawnedThread` and `start()` it, or call
/// `NativeThread.start(_:)` / `start(_:_:)` (joinable) or `NativeThread.detach(_:_:)`.
///
/// There is no way to kill a thread. A thread stopped from outside at an
/// arbitrary instruction cannot release the locks it holds, free what it
/// allocated or finish a write it began; and glibc's `pthread_cancel`
/// unwinds the stack by force, through Swift frames that have no unwinding
/// information, skipping every `defer` and leaving reference counts and the
/// Swift runtime's own state broken. So cancellation is a request:
/// `cancel()` sets a flag, and the thread's body checks `isCancelled` at
/// points where stopping is safe, cleans up and returns.
///
/// Two `NativeThread`s are equal when they are the same object; each thread
/// has one object for its whole life.
public class NativeThread: @unchecked Sendable, Hashable, CustomStringConvertible {
    // @unchecked Sendable: the fields fall into three groups.
    // - `isMain`: set in init and never changed.
    // - The `Atomic` words, and the futex words they point to, accessed only
    //   atomically and through the kernel.
    // - `dictionaryStorage` and `locals`: read and written only by the thread
    //   itself (`requireCurrent` checks the public entry points), then emptied
    //   on that thread as it exits.

    /// `Lifecycle` bits.
    final let lifecycle: Atomic<UInt32>
    /// The kernel thread id; 0 until known.
    final let tid: Atomic<Int32>
    /// The `pthread_t` of a spawned thread, once created.
    final let pthread: Atomic<UInt>
    /// `Cancellation` bits.
    final let cancellation = Atomic<UInt32>(0)
    /// The futex word `sleep` waits on, allocated by the thread itself on its
    /// first sleep (most threads never sleep) and freed in deinit. Holds
    /// `SleepWord` bits.
    final let sleepWord = Atomic<UnsafeMutablePointer<UInt32>?>(nil)

    /// Whether this object stands for the process's main thread.
    let isMain: Bool

    /// The thread dictionary, created on first use; owned by the thread.
    final var dictionaryStorage: ThreadDictionary?

    /// `ThreadLocal` values by slot; owned by the thread.
    final var locals: [ThreadLocalBox?] = []

    /// Bits of the lifecycle word.
    enum Lifecycle {
        /// `start()` has begun (or the thread was not made by Spindle).
        static let started: UInt32 = 1
        /// The body has returned or thrown and its outcome is stored
        /// (set with release; read with acquire before reading the outcome).
        static let finished: UInt32 = 2
        /// A join has begun (or completed).
        static let joined: UInt32 = 4
        /// The thread is detached: nobody may join it.
        static let detached: UInt32 = 8
        /// A thread Spindle did not create, registered on first use.
        static let foreign: UInt32 = 16
    }

    /// Bits of the cancellation word.
    enum Cancellation {
        /// `cancel()` was called.
        static let requested: UInt32 = 1
    }

    /// Bits of the sleep word.
    enum SleepWord {
        /// Mirrors `Cancellation.requested`, set by `cancel()`.
        static let cancelled: UInt32 = 1
        /// The thread is in (or about to enter) a futex sleep on this word,
        /// so `cancel()` must wake it.
        static let sleeping: UInt32 = 2
    }

    init(lifecycle: UInt32, tid: Int32, isMain: Bool = false) {
        self.lifecycle = Atomic(lifecycle)
        self.tid = Atomic(tid)
        self.pthread = Atomic(0)
        self.isMain = isMain
    }

    deinit {
        if let word = sleepWord.load(ordering: .acquiring) { word.deallocate() }
    }

    /// The name the thread was created with, shown once it has exited.
    var creationName: String? { nil }

    /// Runs a spawned thread's body; `SpawnedThread` overrides it. Called by
    /// the entry routine on the new thread.
    func runOnNewThread() {
        misuse("NativeThread.runOnNewThread: not a SpawnedThread")
    }

    // MARK: Finding the current thread

    /// The thread that is running this code. Does not block, makes no system
    /// call once the thread is registered.
    ///
    /// For a thread Spindle started, this is its `SpawnedThread`. Any other
    /// thread (the main thread, a Dispatch or Foundation worker, a raw
    /// pthread) gets a `NativeThread` on its first call, kept until the
    /// thread exits; for the main thread it is `NativeThread.main`.
    public static var current: NativeThread {
        if let raw = cshims_current_thread() {
            return Unmanaged<NativeThread>.fromOpaque(raw).takeUnretainedValue()
        }
        return registerCallingThread()
    }

    /// The current thread's object if it has one, without registering it.
    static var currentIfRegistered: NativeThread? {
        guard let raw = cshims_current_thread() else { return nil }
        return Unmanaged<NativeThread>.fromOpaque(raw).takeUnretainedValue()
    }

    /// The process's main thread (the one whose id is the process id). Usable
    /// from any thread. Its thread-local values are not destroyed when the
    /// process exits: the process ends around it.
    public static let main = NativeThread(
        lifecycle: Lifecycle.started | Lifecycle.foreign, tid: getpid(), isMain: true)

    /// Whether the calling thread is the main thread.
    public static var isMainThread: Bool { current.isMain }

    /// Whether this is the main thread.
    public final var isMainThread: Bool { isMain }

    @inline(never)
    static func registerCallingThread() -> NativeThread {
        let tid = cshims_gettid()
        let thread = tid == getpid()
            ? NativeThread.main
            : NativeThread(lifecycle: Lifecycle.started | Lifecycle.foreign, tid: tid)
        // The key holds one reference, given up by its destructor at exit;
        // the C thread-local is the fast way back to it.
        let record = Unmanaged.passRetained(thread).toOpaque()
        let rc = pthread_setspecific(currentThreadKey, record)
        if rc != 0 { misuse("pthread_setspecific failed: \(errnoDescription(rc))") }
        cshims_set_current_thread(record)
        return thread
    }

    // MARK: Identity

    /// The kernel's id for the thread (`gettid(2)`): what `top -H`, `ps -L`,
    /// `/proc/self/task/<id>` and `perf` show, and what per-thread system
    /// calls take. 0 for a `SpawnedThread` until `start()` has returned.
    /// Linux reuses ids once a thread has exited. Does not block.
    public final var id: Int32 {
        let known = tid.load(ordering: .relaxed)
        if known != 0 { return known }
        // A thread that asks for its own id before its starter has filled it
        // in: read it from its own descriptor (no system call).
        guard NativeThread.currentIfRegistered === self else { return 0 }
        let own = cshims_thread_tid(pthread_self())
        let value = own > 0 ? own : cshims_gettid()
        _ = tid.compareExchange(expected: 0, desired: value, ordering: .relaxed)
        return value
    }

    /// The thread's name as the kernel has it (`ps`, `top`, debuggers): read
    /// from the kernel while the thread runs (`prctl` on itself; a read of
    /// `/proc/self/task/<id>/comm` from another thread, which makes system
    /// calls), otherwise the name it was created with. `nil` for a thread not
    /// yet started and not given a name.
    public final var name: String? {
        if NativeThread.currentIfRegistered === self {
            return ThreadCalls.nameOfCallingThread() ?? creationName
        }
        let state = lifecycle.load(ordering: .acquiring)
        guard state & Lifecycle.started != 0, state & Lifecycle.finished == 0 else { return creationName }
        let known = tid.load(ordering: .relaxed)
        guard known > 0 else { return creationName }
        return ThreadCalls.name(of: known) ?? creationName
    }

    /// Renames the calling thread (`prctl(PR_SET_NAME)`). Throws `nameTooLong`
    /// beyond 15 bytes of UTF-8 (nothing is cut), `nameContainsNUL`.
    ///
    /// Only a thread may rename itself (`NativeThread.current.setName(...)`):
    /// calling it on another thread's object stops the process. Give a new
    /// thread its name through `Attributes.name`.
    public final func setName(_ name: String) throws(NativeThreadError) {
        requireCurrent("setName(_:)")
        try NativeThread.checkName(name)
        ThreadCalls.setNameOfCallingThread(name)
    }

    /// Whether both are the same thread (the same object). Does not block.
    public static func == (lhs: NativeThread, rhs: NativeThread) -> Bool { lhs === rhs }

    /// Hashes the object's identity. Does not block.
    public final func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }

    /// `NativeThread(id: 1234, "worker")`. Reads the name as `name` does
    /// (a `/proc` read for another running thread).
    public var description: String {
        let label = isMain ? "main" : (name.map { "\"\($0)\"" } ?? "unnamed")
        return "NativeThread(id: \(id), \(label))"
    }

    /// Stops the process unless the caller is this thread.
    final func requireCurrent(_ api: String, file: StaticString = #fileID, line: UInt = #line) {
        if NativeThread.currentIfRegistered !== self {
            misuse("NativeThread.\(api): called on \(self) from another thread (\(NativeThread.current)); "
                + "only a thread itself may do this", file: file, line: line)
        }
    }

    // MARK: State

    /// Whether the thread is running: Foundation's `Thread.isExecuting`.
    ///
    /// - A `SpawnedThread`: true from `start()` (set before the kernel
    ///   thread is created; a `start()` that throws makes it false again)
    ///   until its body has returned or thrown and its thread-local values
    ///   have been destroyed; false before `start()` and after that.
    /// - A thread Spindle did not create (the main thread, a Dispatch or
    ///   Foundation worker, a raw pthread): true while it is registered,
    ///   from its first `NativeThread.current` until its exit duties (the
    ///   destruction of its `ThreadLocal` values and dictionary) have run as
    ///   it exits. The main thread's never run: it is executing for the whole
    ///   life of the process.
    ///
    /// Exactly one of `isExecuting` and `isFinished` is true for any thread
    /// that has been started. Readable from any thread; does not block.
    /// Memory: an acquire, pairing with the release that sets `isFinished`.
    public final var isExecuting: Bool {
        let state = lifecycle.load(ordering: .acquiring)
        return state & Lifecycle.started != 0 && state & Lifecycle.finished == 0
    }

    /// Whether the thread has ended: Foundation's `Thread.isFinished`.
    ///
    /// - A `SpawnedThread`: its body has returned or thrown and its
    ///   thread-local values have been destroyed; the kernel thread may
    ///   still be unwinding (`join()` waits for that, and the outcome is
    ///   ready).
    /// - A thread Spindle did not create: it has exited and its exit duties
    ///   (see `isExecuting`) have run. Never true for the main thread.
    ///
    /// Readable from any thread; does not block. Memory: an acquire, pairing
    /// with the thread's release as it finishes: whatever the thread wrote
    /// before it finished (its outcome, its last stores) is visible to a
    /// caller that sees true.
    public final var isFinished: Bool {
        lifecycle.load(ordering: .acquiring) & Lifecycle.finished != 0
    }

    // MARK: Cancellation

    /// Asks the thread to stop. Sets a flag that the thread's body reads
    /// through `isCancelled`, and wakes the thread if it is in
    /// `NativeThread.sleep`. Nothing else: the body decides when and how to
    /// stop (see the type's documentation for why threads are never killed).
    ///
    /// Foundation's `Thread.cancel()`. Works on every thread object, from
    /// any thread: a `SpawnedThread`, the main thread, a foreign thread.
    /// Does not block; cancelling twice, or a finished thread, does nothing
    /// more. Memory: a release. Whatever the caller wrote before `cancel()` is
    /// visible to the thread once it sees `isCancelled` return true.
    public final func cancel() {
        // Sequentially consistent, with the pointer load below and its
        // mirror in `sleep`: either this sees the sleeper's word, or the
        // sleeper sees `requested` before it sleeps.
        cancellation.bitwiseOr(Cancellation.requested, ordering: .sequentiallyConsistent)
        guard let word = sleepWord.load(ordering: .sequentiallyConsistent) else { return }
        let before = AtomicMemory.orOriginal(SleepWord.cancelled, into: word, ordering: .sequentiallyConsistent)
        if before & SleepWord.sleeping != 0 {
            Futex(word).wakeAll()
        }
    }

    /// Whether `cancel()` has been called on this thread: Foundation's
    /// `Thread.isCancelled`. Readable from any thread; does not block.
    /// Memory: an acquire, pairing with `cancel()`'s release.
    public final var isCancelled: Bool {
        cancellation.load(ordering: .acquiring) & Cancellation.requested != 0
    }

    // MARK: Sleeping

    /// Blocks the calling thread until `deadline` passes or the thread is
    /// cancelled, whichever comes first. Returns true if it slept until the
    /// deadline, false if `cancel()` ended it early (or had already been
    /// called: a cancelled thread does not sleep at all). A deadline in the
    /// past returns at once. Signals do not end it.
    ///
    /// Sleeps on a futex (`FUTEX_WAIT_BITSET` with an absolute
    /// `CLOCK_MONOTONIC` deadline), which `cancel()` wakes. The first sleep of
    /// a thread allocates its 4-byte futex word.
    @discardableResult
    @available(*, noasync, message: "blocks the thread; in async code use `try await Task.sleep(for:)`")
    public static func sleep(until deadline: MonotonicClock.Instant) -> Bool {
        let thread = current
        let word = thread.ownSleepWord()
        // Announce the sleep, so that cancel() knows to wake us.
        let before = AtomicMemory.orOriginal(SleepWord.sleeping, into: word, ordering: .sequentiallyConsistent)
        defer { AtomicMemory.and(~SleepWord.sleeping, into: word, ordering: .relaxed) }
        if before & SleepWord.cancelled != 0 { return false }
        if thread.cancellation.load(ordering: .sequentiallyConsistent) & Cancellation.requested != 0 { return false }
        let futex = Futex(word)
        while true {
            // The word is exactly `sleeping` until cancel() sets `cancelled`,
            // and then the kernel refuses to sleep: no wake-up can be lost.
            switch futex.wait(expecting: SleepWord.sleeping, until: deadline) {
            case .timedOut:
                return true
            case .woken, .valueChanged:
                if AtomicMemory.load(from: word, ordering: .acquiring) & SleepWord.cancelled != 0 { return false }
                if MonotonicClock.now >= deadline { return true }
                // A spurious wake-up: sleep again.
            }
        }
    }

    /// The calling thread's sleep word, made on first use. Publishing it is
    /// sequentially consistent, pairing with `cancel()`: if `cancel()` does
    /// not see the word, the `isCancelled` check after this sees the request.
    private final func ownSleepWord() -> UnsafeMutablePointer<UInt32> {
        if let word = sleepWord.load(ordering: .relaxed) { return word }
        let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
        word.initialize(to: 0)
        // Only the thread itself stores the pointer, so a plain store suffices.
        sleepWord.store(word, ordering: .sequentiallyConsistent)
        return word
    }

    /// Blocks the calling thread for `duration`, or until it is cancelled;
    /// see `sleep(until:)`. A zero or negative duration returns at once.
    @discardableResult
    @available(*, noasync, message: "blocks the thread; in async code use `try await Task.sleep(for:)`")
    public static func sleep(for duration: Duration) -> Bool {
        sleep(until: MonotonicClock.now.advanced(by: duration))
    }

    /// Offers the rest of the calling thread's time slice to other runnable
    /// threads (`sched_yield(2)`). Does not block beyond that.
    public static func yield() {
        sched_yield()
    }

    // MARK: Per-thread storage

    /// The thread's dictionary: keys and values that live as long as the
    /// thread and are reachable from any code running on it, as in the
    /// guide's thread-dictionary model.
    ///
    /// Only the thread itself may use it (`NativeThread.current.threadDictionary`):
    /// reaching for another thread's dictionary stops the process, because
    /// nothing would order the two threads' accesses. The values are released
    /// on the thread as it exits, after its `ThreadLocal` destructors have run.
    /// Does not block.
    public final var threadDictionary: ThreadDictionary {
        requireCurrent("threadDictionary")
        if let dictionary = dictionaryStorage { return dictionary }
        let dictionary = ThreadDictionary()
        dictionaryStorage = dictionary
        return dictionary
    }

    /// How many times the exit duties loop when destructors keep storing new
    /// values (the same bound as POSIX's `PTHREAD_DESTRUCTOR_ITERATIONS`).
    static let exitRounds = 4

    /// Runs on the thread as it exits: destroys its `ThreadLocal` values
    /// (destructors in reverse order of the locals' creation) and releases
    /// its dictionary. A destructor may store new values; they are destroyed
    /// in another round, up to `exitRounds`.
    final func runExitDuties() {
        if locals.isEmpty && dictionaryStorage == nil { return }
        for _ in 0..<NativeThread.exitRounds {
            let boxes = locals
            let dictionary = dictionaryStorage
            if boxes.isEmpty && dictionary == nil { return }
            locals = []
            dictionaryStorage = nil
            for box in boxes.reversed() {
                box?.destroy()
            }
            dictionary?.removeAll()
        }
        if !locals.isEmpty || dictionaryStorage != nil {
            writeStandardError("Spindle: thread \(id): thread-local destructors kept storing values for \(NativeThread.exitRounds) rounds; the rest are released without their destructors\n")
            locals = []
            dictionaryStorage = nil
        }
    }

    // MARK: Placement and scheduling

    /// The kernel id to pass to a per-thread system call: 0 for the caller
    /// itself, else the thread's id. Throws `threadExited` for a thread that
    /// is known to have finished.
    final func targetTid(_ api: String) throws(NativeThreadError) -> Int32 {
        if NativeThread.currentIfRegistered === self { return 0 }
        let state = lifecycle.load(ordering: .acquiring)
        let known = tid.load(ordering: .relaxed)
        require(state & Lifecycle.started != 0, "NativeThread.\(api): the thread has not been started")
        if state & Lifecycle.finished != 0 || known == 0 { throw .threadExited(id: known) }
        return known
    }

    /// The CPUs this thread may run on (`sched_getaffinity(2)`). Throws
    /// `threadExited` if it has exited. Does not block.
    public final func affinity() throws(NativeThreadError) -> Set<Int> {
        try ThreadCalls.affinity(of: targetTid("affinity()"))
    }

    /// Restricts this thread to `cpus` (`sched_setaffinity(2)`); it moves at
    /// once if it is running elsewhere. Works on the calling thread
    /// (`NativeThread.current.setAffinity([0])`, e.g. to pin a benchmark) and
    /// on any running thread of the process.
    ///
    /// Throws `emptyCPUSet`, `cpuOutOfRange` for a CPU that is not online,
    /// `cpusNotAllowed` when the process's cpuset excludes all of them,
    /// `threadExited`. Nothing is clamped. Does not block.
    public final func setAffinity(_ cpus: Set<Int>) throws(NativeThreadError) {
        let checked = try Topology.checkCPUs(cpus)
        try ThreadCalls.setAffinity(of: targetTid("setAffinity(_:)"), to: checked)
    }

    /// Runs the calling thread on NUMA node `node` and makes its future
    /// allocations prefer that node's memory: the affinity becomes the node's
    /// CPUs (unless the node has none) and the memory policy
    /// `MPOL_PREFERRED` (`set_mempolicy(2)`). Memory already touched stays
    /// where it is.
    ///
    /// Only the calling thread can do this (the kernel's memory policy is set
    /// by a thread on itself): calling it on another thread's object stops
    /// the process. Throws `numaNodeOutOfRange` for a node that does not
    /// exist (on a one-node machine, every node but 0), `permissionDenied`
    /// where a seccomp profile forbids memory policies. Does not block.
    public final func bindToNUMANode(_ node: Int) throws(NativeThreadError) {
        requireCurrent("bindToNUMANode(_:)")
        let found = try Topology.checkNode(node)
        if !found.cpus.isEmpty {
            try ThreadCalls.setAffinity(of: 0, to: found.cpus)
        }
        try ThreadCalls.preferNode(Int32(node))
    }

    /// Changes how the kernel schedules this thread (`sched_setscheduler(2)`,
    /// and `setpriority(2)` for a relative priority). Works on the calling
    /// thread and on any running thread of the process.
    ///
    /// Throws `priorityOutOfRange` / `realtimePriorityOutOfRange` for a bad
    /// value, `permissionDenied` when the kernel refuses (a real-time policy
    /// or a raise without `CAP_SYS_NICE`), `threadExited`. Does not block.
    public final func setPriority(_ priority: Priority) throws(NativeThreadError) {
        let (policy, value, nice) = try priority.validated()
        let tid = try targetTid("setPriority(_:)")
        try ThreadCalls.setScheduling(of: tid, policy: policy, priority: value, describedAs: priority.description)
        if let nice { try ThreadCalls.setNice(of: tid, to: nice) }
    }

    /// How the kernel schedules this thread now: `.fifo` or `.roundRobin` with
    /// the static priority for a real-time thread, otherwise `.relative` for
    /// its nice value (nice 0 is 0.5). Throws `threadExited`. Does not block.
    public final func priority() throws(NativeThreadError) -> Priority {
        let tid = try targetTid("priority()")
        let (policy, value) = try ThreadCalls.scheduling(of: tid)
        switch policy {
        case Int32(SCHED_FIFO): return .fifo(Int(value))
        case Int32(SCHED_RR): return .roundRobin(Int(value))
        default: return .relative(Priority.relative(forNice: try ThreadCalls.nice(of: tid)))
        }
    }
}

// MARK: - The current-thread key

/// Holds the owned reference of each thread Spindle did not create, from its
/// first `current` until it exits; the destructor below runs then, destroys
/// its thread-local values and gives the reference up. (Spindle's own threads
/// only use the C thread-local `cshims_current_thread`, which they clear
/// themselves before returning.)
let currentThreadKey: pthread_key_t = {
    ForkHandlers.register(.threads, prepare: { _ = NativeThread.main }, child: { _ in NativeThread.childAfterFork() })
    var key = pthread_key_t()
    let rc = pthread_key_create(&key, currentThreadKeyDestructor)
    if rc != 0 {
        misuse("pthread_key_create failed: \(errnoDescription(rc)); the process has used up its thread-specific keys")
    }
    return key
}()

/// Runs as a registered thread exits, with the reference the key holds.
private func currentThreadKeyDestructor(_ raw: UnsafeMutableRawPointer?) {
    guard let raw else { return }
    // glibc cleared the slot before calling us; put it back while the
    // destructors run, so that `current` inside them finds this thread
    // instead of registering a new one, then clear it for good.
    pthread_setspecific(currentThreadKey, raw)
    cshims_set_current_thread(raw)
    let thread = Unmanaged<NativeThread>.fromOpaque(raw)
    thread.takeUnretainedValue().runExitDuties()
    cshims_set_current_thread(nil)
    pthread_setspecific(currentThreadKey, nil)
    // Publishes the thread's last writes to whoever reads `isFinished`
    // (an acquire there).
    thread.takeUnretainedValue().lifecycle.bitwiseOr(NativeThread.Lifecycle.finished, ordering: .releasing)
    thread.release()
}

/// Keys and values that belong to one thread: the guide's thread dictionary,
/// Foundation's `Thread.threadDictionary`.
/// Reach it through `NativeThread.current.threadDictionary`.
///
/// Not `Sendable`: it belongs to its thread and must not be handed to
/// another. Values are released on the thread when it exits. None of its
/// members blocks or orders memory: only one thread ever uses it.
public final class ThreadDictionary {
    private var storage: [AnyHashable: Any] = [:]

    init() {}

    /// The value for `key`, or nil; assigning nil removes the entry.
    public subscript(key: AnyHashable) -> Any? {
        get { storage[key] }
        set { storage[key] = newValue }
    }

    /// The value for `key` if it is a `T`.
    public func value<T>(forKey key: AnyHashable, as type: T.Type = T.self) -> T? {
        storage[key] as? T
    }

    /// Removes and returns the value for `key`.
    @discardableResult
    public func removeValue(forKey key: AnyHashable) -> Any? {
        storage.removeValue(forKey: key)
    }

    /// Removes every entry.
    public func removeAll() {
        storage.removeAll()
    }

    /// The number of entries.
    public var count: Int { storage.count }

    /// The keys, in no particular order.
    public var keys: [AnyHashable] { Array(storage.keys) }
}
