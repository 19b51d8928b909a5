import CShims

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
/// A `NativeThread` gives a thread's identity (`id`, `name`, `isMainThread`),
/// cooperative cancellation (`cancel()`, `isCancelled`, a `sleep` that
/// cancellation cuts short), its per-thread storage (`threadDictionary`, and
/// `ThreadLocal` values), and control of where and how it runs (`setAffinity`,
/// `setPriority`, `bindToNUMANode`).
///
/// To start a thread, make a `SpawnedThread` and `start()` it, or call
/// `NativeThread.start(_:_:)` (joinable) or `NativeThread.detach(_:_:)`.
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
    // - Set in init and never changed: `control`, `creationName`, `isMain`.
    // - The control words, accessed only through AtomicMemory and futexes.
    // - `dictionaryStorage` and `locals`: read and written only by the thread
    //   itself (`requireCurrent` checks the public entry points), then emptied
    //   on that thread as it exits.

    /// Control words, on their own allocation so that futex waits have a
    /// stable address: see `ControlWord` for the layout.
    let control: UnsafeMutableRawPointer

    /// The name the thread was created with, shown once it has exited.
    let creationName: String?

    /// Whether this object stands for the process's main thread.
    let isMain: Bool

    /// The thread dictionary, created on first use; owned by the thread.
    final var dictionaryStorage: ThreadDictionary?

    /// `ThreadLocal` values by slot; owned by the thread.
    final var locals: [ThreadLocalBox?] = []

    /// Offsets into `control`.
    enum ControlWord {
        /// UInt32 `Lifecycle` bits.
        static let lifecycle = 0
        /// UInt32 `Cancellation` bits; the futex that `sleep` waits on.
        static let cancellation = 4
        /// Int32 kernel thread id; 0 until known.
        static let tid = 8
        /// UInt32 `Setup` state; the futex `start()` waits on for a verdict.
        static let setup = 12
        /// UInt64 `pthread_t` of a spawned thread, once created.
        static let pthread = 16
        static let byteCount = 24
    }

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
        /// The thread is in (or about to enter) a futex sleep on this word, so
        /// `cancel()` must wake it.
        static let sleeping: UInt32 = 2
    }

    /// Values of the setup word.
    enum Setup {
        static let pending: UInt32 = 0
        static let succeeded: UInt32 = 1
        static let failed: UInt32 = 2
    }

    init(lifecycle: UInt32, tid: Int32, name: String?, isMain: Bool = false) {
        control = UnsafeMutableRawPointer.allocate(byteCount: ControlWord.byteCount, alignment: 8)
        control.initializeMemory(as: UInt8.self, repeating: 0, count: ControlWord.byteCount)
        control.storeBytes(of: lifecycle, toByteOffset: ControlWord.lifecycle, as: UInt32.self)
        control.storeBytes(of: tid, toByteOffset: ControlWord.tid, as: Int32.self)
        creationName = name
        self.isMain = isMain
    }

    deinit {
        control.deallocate()
    }

    // MARK: Control word access

    final var lifecycleWord: UnsafeMutablePointer<UInt32> {
        (control + ControlWord.lifecycle).assumingMemoryBound(to: UInt32.self)
    }

    final var cancellationWord: UnsafeMutablePointer<UInt32> {
        (control + ControlWord.cancellation).assumingMemoryBound(to: UInt32.self)
    }

    final var tidWord: UnsafeMutablePointer<Int32> {
        (control + ControlWord.tid).assumingMemoryBound(to: Int32.self)
    }

    final var setupWord: UnsafeMutablePointer<UInt32> {
        (control + ControlWord.setup).assumingMemoryBound(to: UInt32.self)
    }

    final var pthreadWord: UnsafeMutablePointer<UInt64> {
        (control + ControlWord.pthread).assumingMemoryBound(to: UInt64.self)
    }

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
        if let raw = pthread_getspecific(currentThreadKey) {
            return Unmanaged<NativeThread>.fromOpaque(raw).takeUnretainedValue()
        }
        return registerCallingThread()
    }

    /// The current thread's object if it has one, without registering it.
    static var currentIfRegistered: NativeThread? {
        guard let raw = pthread_getspecific(currentThreadKey) else { return nil }
        return Unmanaged<NativeThread>.fromOpaque(raw).takeUnretainedValue()
    }

    /// The process's main thread (the one whose id is the process id). Usable
    /// from any thread. Its thread-local values are not destroyed when the
    /// process exits: the process ends around it.
    public static let main = NativeThread(
        lifecycle: Lifecycle.started | Lifecycle.foreign, tid: getpid(), name: nil, isMain: true)

    /// Whether the calling thread is the main thread.
    public static var isMainThread: Bool { current.isMain }

    /// Whether this is the main thread.
    public final var isMainThread: Bool { isMain }

    @inline(never)
    static func registerCallingThread() -> NativeThread {
        let tid = cshims_gettid()
        let thread = tid == getpid()
            ? NativeThread.main
            : NativeThread(lifecycle: Lifecycle.started | Lifecycle.foreign, tid: tid, name: nil)
        // The key holds one reference, given up by its destructor at exit.
        let rc = pthread_setspecific(currentThreadKey, Unmanaged.passRetained(thread).toOpaque())
        if rc != 0 { misuse("pthread_setspecific failed: \(errnoDescription(rc))") }
        return thread
    }

    // MARK: Identity

    /// The kernel's id for the thread (`gettid(2)`): what `top -H`, `ps -L`,
    /// `/proc/self/task/<id>` and `perf` show, and what per-thread system
    /// calls take. 0 for a `SpawnedThread` until `start()` has returned.
    /// Linux reuses ids once a thread has exited. Does not block.
    public final var id: Int32 {
        let tid = AtomicMemory.load(from: tidWord, ordering: .relaxed)
        if tid != 0 { return tid }
        // A thread that asks for its own id before its starter has filled it in.
        guard NativeThread.currentIfRegistered === self else { return 0 }
        let own = cshims_gettid()
        _ = AtomicMemory.compareAndSwap(expected: 0, desired: own, at: tidWord, ordering: .relaxed)
        return own
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
        let state = AtomicMemory.load(from: lifecycleWord, ordering: .acquiring)
        guard state & Lifecycle.started != 0, state & Lifecycle.finished == 0 else { return creationName }
        let tid = AtomicMemory.load(from: tidWord, ordering: .relaxed)
        guard tid > 0 else { return creationName }
        return ThreadCalls.name(of: tid) ?? creationName
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

    public static func == (lhs: NativeThread, rhs: NativeThread) -> Bool { lhs === rhs }

    public final func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }

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

    // MARK: Cancellation

    /// Asks the thread to stop. Sets a flag that the thread's body reads
    /// through `isCancelled`, and wakes the thread if it is in
    /// `NativeThread.sleep`. Nothing else: the body decides when and how to
    /// stop (see the type's documentation for why threads are never killed).
    ///
    /// Does not block; cancelling twice, or a finished thread, does nothing
    /// more. Memory: a release. Whatever the caller wrote before `cancel()` is
    /// visible to the thread once it sees `isCancelled` return true.
    public final func cancel() {
        let before = AtomicMemory.orOriginal(Cancellation.requested, into: cancellationWord, ordering: .acquiringAndReleasing)
        if before & Cancellation.sleeping != 0 {
            Futex(cancellationWord).wakeAll()
        }
    }

    /// Whether `cancel()` has been called on this thread. Does not block.
    /// Memory: an acquire, pairing with `cancel()`'s release.
    public final var isCancelled: Bool {
        AtomicMemory.load(from: cancellationWord, ordering: .acquiring) & Cancellation.requested != 0
    }

    // MARK: Sleeping

    /// Blocks the calling thread until `deadline` passes or the thread is
    /// cancelled, whichever comes first. Returns true if it slept until the
    /// deadline, false if `cancel()` ended it early (or had already been
    /// called: a cancelled thread does not sleep at all). A deadline in the
    /// past returns at once. Signals do not end it.
    ///
    /// Sleeps on a futex (`FUTEX_WAIT_BITSET` with an absolute
    /// `CLOCK_MONOTONIC` deadline), which `cancel()` wakes.
    @discardableResult
    public static func sleep(until deadline: MonotonicClock.Instant) -> Bool {
        let thread = current
        let word = thread.cancellationWord
        // Announce the sleep, so that cancel() knows to wake us; acquiring, to
        // pair with cancel()'s release if it already happened.
        let before = AtomicMemory.orOriginal(Cancellation.sleeping, into: word, ordering: .acquiringAndReleasing)
        defer { AtomicMemory.and(~Cancellation.sleeping, into: word, ordering: .relaxed) }
        if before & Cancellation.requested != 0 { return false }
        let futex = Futex(word)
        while true {
            // The word is exactly `sleeping` until cancel() sets `requested`,
            // and then the kernel refuses to sleep: no wake-up can be lost.
            switch futex.wait(expecting: Cancellation.sleeping, until: deadline) {
            case .timedOut:
                return true
            case .woken, .valueChanged:
                if AtomicMemory.load(from: word, ordering: .acquiring) & Cancellation.requested != 0 { return false }
                if MonotonicClock.now >= deadline { return true }
                // A spurious wake-up: sleep again.
            }
        }
    }

    /// Blocks the calling thread for `duration`, or until it is cancelled;
    /// see `sleep(until:)`. A zero or negative duration returns at once.
    @discardableResult
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
        let state = AtomicMemory.load(from: lifecycleWord, ordering: .acquiring)
        let tid = AtomicMemory.load(from: tidWord, ordering: .relaxed)
        require(state & Lifecycle.started != 0, "NativeThread.\(api): the thread has not been started")
        if state & Lifecycle.finished != 0 || tid == 0 { throw .threadExited(id: tid) }
        return tid
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

/// Maps each thread to its `NativeThread`. A spawned thread sets it on entry
/// (borrowing the reference its entry routine holds) and clears it before it
/// returns. A thread Spindle did not create gets an owned reference when it
/// first asks for `current`; the destructor below runs as that thread exits,
/// destroys its thread-local values and gives the reference up.
let currentThreadKey: pthread_key_t = {
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
    let thread = Unmanaged<NativeThread>.fromOpaque(raw)
    thread.takeUnretainedValue().runExitDuties()
    pthread_setspecific(currentThreadKey, nil)
    thread.release()
}

/// Keys and values that belong to one thread: the guide's thread dictionary.
/// Reach it through `NativeThread.current.threadDictionary`.
///
/// Not `Sendable`: it belongs to its thread and must not be handed to
/// another. Values are released on the thread when it exits.
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
