import CShims
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// What Spindle does around `fork()`: one `pthread_atfork` pair, installed
/// with the first registration, that runs the handlers the layers above
/// register with it (`register`). Support names none of them: each layer
/// registers its own the first time it has state a child must repair (the
/// lock-name table, the thread records, the run loops, the worker pools and
/// queues, the event sources), so the dependency points one way, up to
/// down.
///
/// **Order.** Handlers run by `Stage`, the layers' order from the bottom
/// up (locks, threads, run loops, queues, event sources), and within a stage in
/// the order they were registered; `prepare` in the parent just before the
/// fork, `child` in the child just after it, both in that order. Before
/// any child handler, the child advances the fork epoch (see below) and
/// passes it to each.
///
/// After `fork()` the child has one thread, a copy of the one that forked,
/// with that thread's thread-specific values: its run loop (whose epoll
/// instance or io_uring ring is shared with the parent, so using it would
/// take the parent's events, change what the parent watches, or, on
/// io_uring, cancel the parent's polls when the child exits) and its thread
/// record (with the parent's thread id). The handlers drop both from the
/// thread's slots without touching them, so the child's first
/// `ThreadLoop.current` makes a new loop and its first `NativeThread.current`
/// a new record; the child's thread is the child's main thread (its id is
/// the child's pid), and the main loop starts afresh. The parent's objects
/// are left alone in the child's memory (never released: their teardown
/// would act on the parent's kernel objects); in the parent nothing changes.
///
/// Queues the parent's other threads were using are repaired lazily, the
/// first time the child takes their lock (`WorkQueue.repairAfterFork`): the
/// child advances the fork epoch their state is checked against, and the
/// queues' handler notes what the forking thread itself holds of the
/// queues whose items it runs.
///
/// The child handler takes no lock: a lock of Spindle's that a thread of the
/// parent held at the fork is replaced, not waited for. It allocates only
/// that lock (glibc's malloc is usable in the child of a multithreaded
/// process). Nor may it make type metadata or look up a conformance: those
/// take the Swift runtime's locks, which a parent thread may have held at
/// the fork and nobody releases in the child. So `prepare` makes, in the
/// parent, what the child handler would: the runtime's caches of the
/// standard library's generic types (`makeRuntimeCaches`), the lazy
/// globals, the generic types and conformances of each layer's code
/// (`makeMetadata`, `makeConformance`; `scripts/check-fork-metadata`
/// checks them), and the generic code of `WorkerPool.childAfterFork` and
/// the timer heap's, run on nothing. The same limit holds for any Swift
/// code the child runs later, which Spindle cannot lift.
enum ForkHandlers {
    /// When a layer's handlers run: the layers' order, from the bottom up.
    enum Stage: Int, Sendable {
        /// Locks' side tables (`LockNames`).
        case locks
        /// Thread records (`NativeThread`).
        case threads
        /// Per-thread run loops (`LoopRegistry`).
        case runLoops
        /// Worker pools, work queues and their delayed work.
        case queues
        /// Event sources: the reactor, the process-wide registries, the
        /// queue timers' heap.
        case eventSources
        /// Ports: the wire format's generic code (`PortWire`).
        case ports
    }

    /// One registration.
    private final class Entry: Sendable {
        let stage: Stage
        let prepare: (@Sendable () -> Void)?
        let child: @Sendable (_ epoch: UInt32) -> Void

        init(stage: Stage, prepare: (@Sendable () -> Void)?, child: @escaping @Sendable (UInt32) -> Void) {
            self.stage = stage
            self.prepare = prepare
            self.child = child
        }
    }

    /// An immutable snapshot of the registrations, in running order.
    private final class List: Sendable {
        let entries: [Entry]
        init(_ entries: [Entry]) { self.entries = entries }
    }

    /// The current snapshot. A registration replaces it with a
    /// compare-and-swap (acquiring and releasing, pairing with the loads in
    /// `prepare` and `child`); the snapshot it replaced is never released,
    /// as a handler on another thread may be walking it (a few registrations
    /// per process, a few dozen bytes each).
    private static let list = Atomic<Unmanaged<List>?>(nil)

    /// Adds a handler pair for `stage`: `prepare` (optional) runs in the
    /// parent just before every later `fork()`, `child` in the child just
    /// after it, with the child's fork epoch. Register once per layer (a
    /// `static let` of the layer's own), before the state it repairs can
    /// exist in a child. `child` must take no lock, allocate no type
    /// metadata and look up no conformance (see the type's doc). Any
    /// thread; never blocks.
    static func register(
        _ stage: Stage,
        prepare: (@Sendable () -> Void)? = nil,
        child: @escaping @Sendable (_ epoch: UInt32) -> Void
    ) {
        _ = installed
        let entry = Entry(stage: stage, prepare: prepare, child: child)
        var current = list.load(ordering: .acquiring)
        while true {
            var entries = current?.takeUnretainedValue().entries ?? []
            var at = entries.count
            while at > 0 && entries[at - 1].stage.rawValue > stage.rawValue { at -= 1 }
            entries.insert(entry, at: at)
            let next = Unmanaged.passRetained(List(entries))
            let (exchanged, seen) = list.compareExchange(
                expected: current, desired: next, ordering: .acquiringAndReleasing)
            if exchanged { return }
            next.release()
            current = seen
        }
    }

    /// In a `prepare` handler: makes the metadata of `types` now, in the
    /// parent. A build without specialization (debug) makes the metadata of
    /// a generic type (an optional, an array, its iterator) the first time
    /// code uses it, under the Swift runtime's locks, and caches it per
    /// module. Code the child runs from its first moment (a new worker's
    /// loop, the poller) and that a parent thread may never have run (a
    /// worker that has run one long item since it started) names its types
    /// here; in the child a parent thread that held one of those locks at
    /// the fork would make it wait forever (seen: a child's new worker hung
    /// making `PoolPoller?` while a parent thread made another optional).
    /// Each type passed here is loaded through the same module-wide cache
    /// as the code's own use of it.
    static func makeMetadata(_ types: Any.Type...) {
        for type in types { _ = ObjectIdentifier(type) }
    }

    /// `makeMetadata` for a type that is not copyable (no `Any.Type`).
    @inline(never)
    static func makeMetadata<T: ~Copyable>(ofNoncopyable type: T.Type) {}

    /// The same for protocol conformances: a debug build looks up a
    /// conformance's witness table the first time code needs it (for a
    /// generic type's, making it, under the runtime's locks) and caches it
    /// per module. Passing a type here loads the same cache the code's own
    /// use does. One function per protocol the pool's or the ports' code
    /// needs.
    @inline(never) static func makeConformance<T: Sequence>(sequence type: T.Type) {}
    @inline(never) static func makeConformance<T: Collection>(collection type: T.Type) {}
    @inline(never) static func makeConformance<T: BidirectionalCollection>(bidirectional type: T.Type) {}
    @inline(never) static func makeConformance<T: RandomAccessCollection>(randomAccess type: T.Type) {}
    @inline(never) static func makeConformance<T: MutableCollection>(mutable type: T.Type) {}
    @inline(never) static func makeConformance<T: RangeReplaceableCollection>(rangeReplaceable type: T.Type) {}
    @inline(never) static func makeConformance<T: BinaryInteger>(binaryInteger type: T.Type) {}
    @inline(never) static func makeConformance<T: SignedInteger>(signedInteger type: T.Type) {}
    @inline(never) static func makeConformance<T: FixedWidthInteger>(fixedWidthInteger type: T.Type) {}
    @inline(never) static func makeConformance<T: RangeExpression>(rangeExpression type: T.Type) {}
    @inline(never) static func makeConformance<T: SetAlgebra>(setAlgebra type: T.Type) {}
    @inline(never) static func makeConformance<T: OptionSet>(optionSet type: T.Type) {}
    @inline(never) static func makeConformance<T: AtomicMemoryWord>(atomicWord type: T.Type) {}
    @inline(never) static func makeConformance<T: Equatable>(equatable type: T.Type) {}
    @inline(never) static func makeConformance<T: Hashable>(hashable type: T.Type) {}
    @inline(never) static func makeConformance<T: Comparable>(comparable type: T.Type) {}
    @inline(never) static func makeConformance<T: Error>(error type: T.Type) {}
    @inline(never) static func makeConformance<T: CustomStringConvertible>(described type: T.Type) {}
    @inline(never) static func makeConformance<T: RawRepresentable>(rawRepresentable type: T.Type) {}

    /// Installs the `pthread_atfork` pair without registering a handler:
    /// from then on every `fork()` advances the child's fork epoch, which is
    /// all a `ForkRepairedLock` needs. Any thread; idempotent.
    static func install() { _ = installed }

    private static let installed: Void = {
        let rc = pthread_atfork({ ForkHandlers.prepare() }, nil, { ForkHandlers.child() })
        if rc != 0 { misuse("pthread_atfork failed: \(errnoDescription(rc))") }
    }()

    /// The snapshot whose `prepare` handlers ran for the fork under way:
    /// the child runs the `child` handlers of exactly those (a handler
    /// registered meanwhile had nothing made for it in the parent). Written
    /// and read by the forking thread only.
    private static let prepared = Atomic<Unmanaged<List>?>(nil)

    private static func prepare() {
        // Once per process: a cache once set up stays so (in children too).
        if !runtimeCachesMade.load(ordering: .acquiring) {
            makeRuntimeCaches(CacheProbe(), CacheProbeObject())
            runtimeCachesMade.store(true, ordering: .releasing)
        }
        // Until no prepare handler registers another layer's handlers (a
        // layer's prepare may make the first object of a layer below).
        var done: Unmanaged<List>?
        while let current = list.load(ordering: .acquiring), current.toOpaque() != done?.toOpaque() {
            let entries = current.takeUnretainedValue().entries
            // An index loop, as in `child`: the same code, its metadata
            // made here.
            var i = 0
            while i < entries.count {
                entries[i].prepare?()
                i += 1
            }
            done = current
        }
        prepared.store(done, ordering: .relaxed)
    }

    /// The Swift runtime keeps a metadata cache per generic type (one for
    /// every `Optional<T>`, one for every `Array<T>`, ...), set up the first
    /// time code asks it for an instance of that type by its arguments, as
    /// unspecialized generic code does; a process whose code has so far used
    /// only instances made in advance (specialized code, a module's own
    /// prespecialized ones) sets it up late, under a lock held while it
    /// does. A child forked while another parent thread set one up waits
    /// forever the first time it needs that type, whatever instance (seen,
    /// 2026-11-29: a child in `SignalWatch`'s handler, making `freeSlots`,
    /// on `Optional`'s cache; and one in `TimerQueue`'s, on `Array`'s). So
    /// the first `prepare` of the process goes through the caches of the
    /// standard library's generic types that Spindle's child code uses,
    /// setting them up (waiting for a thread that is setting one up); a
    /// cache set up stays so. The entries the child looks up are made by
    /// each layer's warm-up (`makeMetadata`).
    @inline(never)
    @_semantics("optimize.sil.specialize.generic.never")
    private static func makeRuntimeCaches<T: Hashable, Object: AnyObject>(_ value: T, _ object: Object) {
        var array = [value]
        array.append(value)
        var copied = Array(array.reversed())
        copied.swapAt(0, 1)
        for element in array.indices.reversed() { _ = copied[element] }
        let optional: T? = array.first
        let dictionary = [value: array]
        for (key, values) in dictionary where key == optional { _ = values.count }
        _ = dictionary.values.first
        _ = Set(array).first
        _ = ContiguousArray(array)[...].first
        _ = Result<T, Never>.success(value)
        _ = Unmanaged.passUnretained(object)
        _ = [object].first
    }

    /// Whether `makeRuntimeCaches` has run in this process (or before the
    /// fork that made it).
    private static let runtimeCachesMade = Atomic<Bool>(false)

    private struct CacheProbe: Hashable {}
    private final class CacheProbeObject {}

    private static func child() {
        // First: everything below, and every queue from now on, is of the
        // child's epoch (see `WorkQueue.repairAfterFork`).
        let epoch = UInt32(cshims_advance_fork_epoch())
        guard let current = prepared.load(ordering: .relaxed) else { return }
        let entries = current.takeUnretainedValue().entries
        var i = 0
        while i < entries.count {
            entries[i].child(epoch)
            i += 1
        }
    }
}
