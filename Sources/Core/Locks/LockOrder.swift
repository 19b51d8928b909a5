import CShims
import Runtime
import Synchronization

/// Spindle's lock-order checker: finds the lock-order inversions that can
/// deadlock (thread 1 holds A and waits for B while thread 2 holds B and
/// waits for A) from runs that did not deadlock, and stops the process at
/// the acquisition that closes the cycle, before the thread waits.
///
/// Off by default. `SPINDLE_LOCK_ORDER=1` in a process's environment (read
/// once, before `main`) or `LockOrder.enable()` at its start switches it on
/// for the process. It covers `Lock`, `RecursiveLock`, `LockedValue`,
/// `ReadWriteLock`, `SpinLock`, `Condition`, `ConditionLock`, `ConditionVariable`'s lock,
/// `synchronized` and `AsyncLock`; Spindle's internal guards (held for a
/// few instructions, never while waiting) are not tracked.
///
/// What it keeps, and why it stays small and fast (the shape of Abseil's
/// deadlock detector, with Linux lockdep's chain cache):
///
/// - For each thread, the locks it holds, in order (a short array); for a
///   task, the `AsyncLock`s it holds.
/// - One directed graph over lock instances (keyed by the lock's address, or
///   `synchronized`'s object): an edge A → B says some thread acquired B
///   while holding A, with the place it did so and whether each of the two
///   holds was shared. A lock's storage removes its node when it goes away,
///   so an address reused by a later lock starts with no history.
/// - An acquisition that adds a new edge A → B first looks for a path
///   B → … → A; finding one is the cycle. New edges are rare: a program
///   has few distinct nestings, each is searched once.
/// - Each thread remembers the chains of held locks it has already checked
///   (a 64-bit key of the held locks and the new one, lockdep's chain key):
///   a nesting seen before costs one hash-set look-up and no global lock.
///
/// Read holds follow lockdep's rule for non-recursive readers (its
/// `rw_semaphore`): `ReadWriteLock` lets a waiting writer in before new
/// readers, so a read acquisition can wait for a read hold (through the
/// writer queued between them). A read hold therefore counts as an
/// exclusive one in a cycle, and a thread that takes a read lock again
/// while it holds it for reading is reported as a self-deadlock. (The graph
/// keeps lockdep's exemption for readers that never wait for readers, a
/// cycle crossing such a lock read against read being no deadlock, for a
/// lock kind that has them; none of Spindle's does.) A `RecursiveLock` or
/// `synchronized` object taken again by its holder is recursion, not a
/// cycle; any other lock taken again by its holder is a self-deadlock and
/// is reported as one. A `tryLock` never
/// waits, so it closes no cycle, but what is acquired while holding it
/// orders after it. A timed acquisition is checked as a blocking one (an
/// inversion that only a time-out resolves is still a bug).
///
/// Cost, and how to read a report: <doc:StressTesting>.
public enum LockOrder {
    /// Switches the checker on for the rest of the process (the same as
    /// `SPINDLE_LOCK_ORDER=1`). Call it at the start, before threads take
    /// locks: locks held when it is called are not known to be held. Never
    /// blocks; there is no way to switch it off again.
    public static func enable() { cshims_lock_order_enable() }

    /// Whether the checker is on.
    public static var isEnabled: Bool { cshims_lock_order_on() != 0 }

    // MARK: Per-thread state

    /// A lock a thread (or task) holds.
    struct Held: @unchecked Sendable {
        // @unchecked: values only; `Any.Type` (a metatype) is immutable.
        var id: UInt
        var kind: LockHooks.Kind
        /// Times taken (a recursive lock's, or a read lock's, depth).
        var depth: Int
        /// For `synchronized`: the object's type, for the report.
        var objectType: Any.Type?
        /// For `synchronized`: the object, held weakly (it is alive while
        /// held), for a node made for it.
        weak var object: AnyObject?
    }

    /// One thread's holds and its cache of checked chains. Only its thread
    /// touches it.
    final class Record: @unchecked Sendable {
        // @unchecked: reached only through the calling thread's
        // `cshims_lock_order_record` (or, for a task, under `tasks`' lock).
        var held: [Held] = []
        var checkedChains = Set<UInt64>()
        var generation = 0
        /// Set while the checker itself runs on this thread, so that a lock
        /// it takes (a name look-up) is not checked.
        var busy = false
    }

    static var threadRecord: Record {
        if let raw = cshims_lock_order_thread_record() {
            return Unmanaged<Record>.fromOpaque(raw).takeUnretainedValue()
        }
        // Kept for the thread's life (a few hundred bytes per thread, and
        // only while the checker is on).
        let record = Record()
        cshims_lock_order_set_thread_record(Unmanaged.passRetained(record).toOpaque())
        return record
    }

    // MARK: The graph

    /// How `from` was held and `to` taken on an edge: bit 0 `from` shared,
    /// bit 1 `to` shared; an edge keeps one bit per combination seen.
    static func modeBit(fromShared: Bool, toShared: Bool) -> UInt8 {
        1 << ((fromShared ? 1 : 0) | (toShared ? 2 : 0))
    }

    struct Edge: @unchecked Sendable {
        // @unchecked: values only (a captured backtrace is never changed).
        var modes: UInt8
        /// Where `to` was first acquired while `from` was held.
        var site: Backtrace?
    }

    struct Node: @unchecked Sendable {
        // @unchecked: values only; `Any.Type` (a metatype) is immutable;
        // `object` is a weak reference, never used but compared with nil.
        var kind: StaticString
        var objectType: Any.Type?
        /// A `synchronized` object's node holds it weakly: Spindle does not
        /// see the object go away, and a later object may get its address.
        weak var object: AnyObject?
        var out: [UInt: Edge] = [:]
        var incoming: Set<UInt> = []

        init(kind: StaticString, objectType: Any.Type?, object: AnyObject?) {
            self.kind = kind
            self.objectType = objectType
            self.object = object
        }

        /// A `synchronized` object's node whose object has gone away: its
        /// history is no longer any object's.
        var isDeadObject: Bool { objectType != nil && object == nil }
    }

    struct Graph: @unchecked Sendable {
        // @unchecked: `Any.Type` values (metatypes) are immutable.
        var nodes: [UInt: Node] = [:]
        /// The node count at which the next check drops every dead object's
        /// node (doubling, as a hash table grows): a program that locks
        /// objects by the million keeps the graph to about twice the objects
        /// alive.
        var sweepAt = 1_024

        /// Drops `id`'s node and its edges; whether there was one.
        mutating func remove(_ id: UInt) -> Bool {
            guard let node = nodes.removeValue(forKey: id) else { return false }
            for from in node.incoming { nodes[from]?.out.removeValue(forKey: id) }
            for to in node.out.keys { nodes[to]?.incoming.remove(id) }
            return true
        }

        /// Drops `id`'s node if it belonged to an object that has gone away
        /// (so that an object at its address starts with no history);
        /// whether it did.
        mutating func removeIfDead(_ id: UInt) -> Bool {
            guard nodes[id]?.isDeadObject == true else { return false }
            return remove(id)
        }

        /// Past `sweepAt` nodes, drops every dead object's node; whether it
        /// dropped any.
        mutating func sweepIfLarge() -> Bool {
            guard nodes.count >= sweepAt else { return false }
            let dead = nodes.compactMap { $0.value.isDeadObject ? $0.key : nil }
            for id in dead { _ = remove(id) }
            sweepAt = max(1_024, 2 * nodes.count)
            return !dead.isEmpty
        }
    }

    static let graph = Mutex(Graph())
    /// Locks (and `synchronized` objects) in the graph, for tests.
    package static var nodeCount: Int { graph.withLock { $0.nodes.count } }
    /// Bumped when a node goes away: every thread's chain cache is stale.
    static let generation = Atomic<Int>(0)

    /// `AsyncLock` holds, by task (a task may resume on any thread), and
    /// which task holds each lock.
    struct TaskHolds: @unchecked Sendable {
        // @unchecked: `Held` keeps only values and metatypes.
        var held: [UnsafeCurrentTask: [Held]] = [:]
        var holder: [UInt: UnsafeCurrentTask] = [:]
    }
    static let tasks = Mutex(TaskHolds())
    static let asyncHolds = Atomic<Int>(0)

    // MARK: Hooks

    /// A blocking acquisition is about to start: check it, then record the
    /// hold (lockdep's order: recorded before the wait, so a report names
    /// the acquisition that would wait).
    @usableFromInline
    @inline(never)
    static func willAcquire(_ id: UInt, _ kind: LockHooks.Kind, object: AnyObject?) {
        let record = threadRecord
        if record.busy { return }
        record.busy = true
        defer { record.busy = false }
        let objectType: Any.Type? = object.map { type(of: $0) }
        if kind.isTaskHeld {
            acquireAsync(id, kind, record)
            return
        }
        if deepened(id, kind, in: &record.held) { return }
        let mine = taskHeld()
        check(id, kind, objectType, object, held: mine.isEmpty ? record.held : record.held + mine, record: record)
        record.held.append(Held(id: id, kind: kind, depth: 1, objectType: objectType, object: object))
    }

    /// A blocking acquisition for `synchronized(object)`.
    @usableFromInline
    @inline(never)
    static func willAcquire(object: AnyObject) {
        willAcquire(UInt(bitPattern: ObjectIdentifier(object)), .synchronized, object: object)
    }

    /// A `tryLock` succeeded: record the hold, with no check.
    @usableFromInline
    @inline(never)
    static func didTryAcquire(_ id: UInt, _ kind: LockHooks.Kind) {
        let record = threadRecord
        if record.busy { return }
        if kind.isTaskHeld {
            recordAsync(Held(id: id, kind: kind, depth: 1, objectType: nil))
            return
        }
        if deepened(id, kind, in: &record.held, checkOnly: false) { return }
        record.held.append(Held(id: id, kind: kind, depth: 1, objectType: nil))
    }

    /// A release, or a timed acquisition that gave up: forget one hold.
    @usableFromInline
    @inline(never)
    static func didRelease(_ id: UInt, _ kind: LockHooks.Kind) {
        if kind.isTaskHeld {
            // (`AsyncLock` never reports a failed acquisition: it records a
            // hold only once it has one.)
            releaseAsync(id)
            return
        }
        let record = threadRecord
        if record.busy { return }
        // Most recent first: holds are usually released in reverse order.
        guard let index = record.held.lastIndex(where: { $0.id == id }) else { return }
        record.held[index].depth -= 1
        if record.held[index].depth == 0 { record.held.remove(at: index) }
    }

    /// `synchronized(object)` left its outermost (or a nested) body.
    @usableFromInline
    @inline(never)
    static func didRelease(object: AnyObject) {
        didRelease(UInt(bitPattern: ObjectIdentifier(object)), .synchronized)
    }

    /// The lock at `id` is gone: drop its node and its edges.
    @usableFromInline
    @inline(never)
    static func forget(_ id: UInt) {
        if graph.withLock({ $0.remove(id) }) { generation.add(1, ordering: .relaxed) }
    }

    /// Whether the lock is already held by this thread: then a recursive
    /// lock, or a read lock held for reading, goes one deeper (returns
    /// true), and anything else is a self-deadlock (stops).
    static func deepened(_ id: UInt, _ kind: LockHooks.Kind, in held: inout [Held], checkOnly: Bool = true) -> Bool {
        guard let index = held.lastIndex(where: { $0.id == id }) else { return false }
        let hold = held[index]
        if kind.isRecursive || (kind.neverWaitsForReaders && hold.kind.neverWaitsForReaders) {
            held[index].depth += 1
            return true
        }
        if !checkOnly { return false }
        let name = label(id, kind.name, hold.objectType)
        let why =
            kind.isShared && hold.kind.isShared
            ? "for reading again by the thread that holds it for reading: readers queue behind a waiting writer, so a writer that comes between the two acquisitions waits for the first while the second waits for it (self-deadlock)"
            : "again by the thread that holds it\(hold.kind.isShared ? " for reading" : ""): it would wait for itself forever (self-deadlock)"
        misuse("lock order: \(name) is acquired \(why). \(describe(Backtrace.captureSites(), "This acquisition"))")
    }

    // MARK: The check

    /// Checks the acquisition of `id` (for `synchronized`, of `object`)
    /// while `held` are held, adding the new edges; stops with a report if
    /// one closes a cycle. Nodes of `synchronized` objects that have gone
    /// away are dropped on the way: the new acquisition's and the holds'
    /// (an object alive now at a dead one's address) before they are used,
    /// any other's when the search meets it, and all of them when the
    /// graph has doubled.
    static func check(
        _ id: UInt, _ kind: LockHooks.Kind, _ objectType: Any.Type?, _ object: AnyObject?, held: [Held], record: Record
    ) {
        if held.isEmpty { return }
        let current = generation.load(ordering: .relaxed)
        if record.generation != current || record.checkedChains.count > 4096 {
            record.checkedChains.removeAll(keepingCapacity: true)
            record.generation = current
        }
        let key = chainKey(held, id, kind)
        if record.checkedChains.contains(key) { return }

        var site: Backtrace?
        var cycle: [(from: UInt, to: UInt, site: Backtrace?)]?
        var cycleClosing: Held?
        var dropped = false
        graph.withLock { graph in
            if graph.sweepIfLarge() { dropped = true }
            if graph.removeIfDead(id) { dropped = true }
            if graph.nodes[id] == nil { graph.nodes[id] = Node(kind: kind.name, objectType: objectType, object: object) }
            for hold in held where hold.id != id {
                if graph.removeIfDead(hold.id) { dropped = true }
                let bit = modeBit(fromShared: hold.kind.neverWaitsForReaders, toShared: kind.neverWaitsForReaders)
                if let edge = graph.nodes[hold.id]?.out[id], edge.modes & bit != 0 { continue }
                if let path = findPath(
                    in: graph, from: id, arrivingShared: kind.neverWaitsForReaders, to: hold.id,
                    heldShared: hold.kind.neverWaitsForReaders)
                {
                    cycle = path
                    cycleClosing = hold
                    return
                }
                if site == nil { site = Backtrace.captureSites() }
                if graph.nodes[hold.id] == nil {
                    graph.nodes[hold.id] = Node(kind: hold.kind.name, objectType: hold.objectType, object: hold.object)
                }
                graph.nodes[hold.id]!.out[id, default: Edge(modes: 0, site: site)].modes |= bit
                graph.nodes[id]!.incoming.insert(hold.id)
            }
        }
        if let cycle, let closing = cycleClosing {
            report(acquiring: id, kind, objectType, holding: closing, cycle: cycle)
        }
        if dropped {
            // Every thread's cached chains may name a dropped object's address.
            generation.add(1, ordering: .relaxed)
            record.checkedChains.removeAll(keepingCapacity: true)
            record.generation = generation.load(ordering: .relaxed)
        }
        record.checkedChains.insert(key)
    }

    /// lockdep's chain key: the held locks and the new one, with their
    /// modes, folded into 64 bits.
    static func chainKey(_ held: [Held], _ id: UInt, _ kind: LockHooks.Kind) -> UInt64 {
        var key: UInt64 = 0xcbf2_9ce4_8422_2325
        func mix(_ value: UInt64) {
            key = (key ^ value) &* 0x0000_0100_0000_01b3
            key ^= key >> 29
        }
        for hold in held { mix(UInt64(hold.id) ^ UInt64(hold.kind.options)) }
        mix(UInt64(id) ^ (UInt64(kind.options) << 56))
        return key
    }

    /// A path `from` → … → `to` along which every lock would really wait:
    /// at each lock on it, the hold that arrives and the hold that leaves
    /// are not both shared; and at the two ends, likewise with the
    /// acquisition being checked (`arrivingShared`) and the hold that it
    /// happens under (`heldShared`). Breadth first, over (lock, arrived
    /// shared) pairs.
    static func findPath(
        in graph: Graph, from: UInt, arrivingShared: Bool, to: UInt, heldShared: Bool
    ) -> [(from: UInt, to: UInt, site: Backtrace?)]? {
        struct State: Hashable { var node: UInt; var shared: Bool }
        var parent: [State: State] = [:]
        let start = State(node: from, shared: arrivingShared)
        var queue = [start]
        var seen: Set<State> = [start]
        var head = 0
        while head < queue.count {
            let state = queue[head]
            head += 1
            if state.node == to && !(state.shared && heldShared) && state != start {
                var edges: [(from: UInt, to: UInt, site: Backtrace?)] = []
                var s = state
                while let p = parent[s] {
                    edges.append((p.node, s.node, graph.nodes[p.node]?.out[s.node]?.site))
                    s = p
                }
                return edges.reversed()
            }
            // A dead object's node leads nowhere: its object can wait for
            // nothing any more.
            guard let node = graph.nodes[state.node], !node.isDeadObject else { continue }
            for (next, edge) in node.out {
                for fromShared in [false, true] {
                    for toShared in [false, true] where edge.modes & modeBit(fromShared: fromShared, toShared: toShared) != 0 {
                        // Two shared holds of one lock do not wait for each other.
                        if state.shared && fromShared { continue }
                        let n = State(node: next, shared: toShared)
                        if seen.insert(n).inserted {
                            parent[n] = state
                            queue.append(n)
                        }
                    }
                }
            }
        }
        return nil
    }

    // MARK: AsyncLock

    static func currentTask() -> UnsafeCurrentTask? { withUnsafeCurrentTask { $0 } }

    /// The `AsyncLock`s the current task holds (none outside a task).
    static func taskHeld() -> [Held] {
        if asyncHolds.load(ordering: .relaxed) == 0 { return [] }
        guard let task = currentTask() else { return [] }
        return tasks.withLock { $0.held[task] ?? [] }
    }

    static func acquireAsync(_ id: UInt, _ kind: LockHooks.Kind, _ record: Record) {
        let mine = taskHeld()
        if mine.contains(where: { $0.id == id }) {
            misuse(
                "lock order: \(label(id, kind.name, nil)) is acquired again by the task that holds it: it would wait for itself forever (self-deadlock). \(describe(Backtrace.captureSites(), "This acquisition"))")
        }
        // Recorded once acquired (`didTryAcquire`): a task in line holds
        // nothing yet, and another task may hold the lock meanwhile.
        check(id, kind, nil, nil, held: record.held + mine, record: record)
    }

    static func recordAsync(_ hold: Held) {
        guard let task = currentTask() else { return }
        tasks.withLock { tasks in
            tasks.held[task, default: []].append(hold)
            tasks.holder[hold.id] = task
        }
        asyncHolds.add(1, ordering: .relaxed)
    }

    /// Any task may unlock an `AsyncLock`: the hold is dropped from the task
    /// that took it.
    static func releaseAsync(_ id: UInt) {
        let dropped = tasks.withLock { tasks -> Bool in
            guard let task = tasks.holder.removeValue(forKey: id) else { return false }
            tasks.held[task]?.removeAll { $0.id == id }
            if tasks.held[task]?.isEmpty == true { tasks.held.removeValue(forKey: task) }
            return true
        }
        if dropped { asyncHolds.subtract(1, ordering: .relaxed) }
    }

    // MARK: The report

    /// `Lock "db" (0x…)`, `synchronized(Account) (0x…)`: how a report names
    /// a lock.
    static func label(_ id: UInt, _ kind: StaticString, _ objectType: Any.Type?) -> String {
        let address = "0x" + String(id, radix: 16)
        if let objectType { return "synchronized(\(objectType)) (object \(address))" }
        if let pointer = UnsafeRawPointer(bitPattern: id), let name = LockNames.name(at: pointer) {
            return "\(kind) \"\(name)\" (\(address))"
        }
        return "\(kind) (\(address))"
    }

    static func report(
        acquiring id: UInt, _ kind: LockHooks.Kind, _ objectType: Any.Type?, holding closing: Held,
        cycle: [(from: UInt, to: UInt, site: Backtrace?)]
    ) -> Never {
        let nodes = graph.withLock { $0.nodes }
        func name(_ node: UInt) -> String {
            if node == id { return label(id, kind.name, objectType) }
            if node == closing.id { return label(closing.id, closing.kind.name, closing.objectType) }
            let info = nodes[node]
            return label(node, info?.kind ?? "lock", info?.objectType)
        }
        var lines = [
            "lock order: acquiring \(name(id)) while holding \(name(closing.id)) closes a cycle of lock acquisitions; threads taking these locks in these orders can deadlock:",
            "  \(name(closing.id)) -> \(name(id)): \(describe(Backtrace.captureSites(), "this acquisition (the thread has not waited yet)"))",
        ]
        for edge in cycle {
            lines.append("  \(name(edge.from)) -> \(name(edge.to)): \(describe(edge.site, "acquired while holding it"))")
        }
        misuse(lines.joined(separator: "\n"))
    }

    /// Where a backtrace was taken, as the first frames outside Spindle's
    /// lock code: `file:line in function`, symbolicated from the binary's
    /// debug information (`Runtime.Backtrace`), or return addresses where
    /// the binary has none.
    static func describe(_ backtrace: Backtrace?, _ what: String) -> String {
        guard let backtrace else { return "\(what) at an unknown place" }
        let spindleFiles = ["/Sources/Core/Locks/", "/Sources/Core/Conditions/", "/Sources/Core/Concurrency/AsyncLock.swift"]
        var places: [String] = []
        if let symbolicated = backtrace.symbolicated(with: ImageMap.capture()) {
            // The frames above the lock code are the capture's own; the
            // caller's begin below the last frame in Spindle's lock files.
            var inLockCode = false
            for frame in symbolicated.frames {
                guard let symbol = frame.symbol else { continue }
                let path = symbol.sourceLocation?.path ?? ""
                if spindleFiles.contains(where: { path.contains($0) }) {
                    inLockCode = true
                    continue
                }
                if !inLockCode { continue }
                if let location = symbol.sourceLocation {
                    places.append("\(location.path):\(location.line) in \(symbol.name)")
                } else {
                    places.append(symbol.name)
                }
                if places.count == 3 { break }
            }
        }
        if places.isEmpty {
            places = backtrace.frames.prefix(6).map { "\($0.adjustedProgramCounter)" }
        }
        return "\(what) at " + places.joined(separator: ", called from ")
    }
}

extension Backtrace {
    /// The calling stack, or nil if it cannot be had: only taken when an
    /// edge is new or a report is made. With the shared image map: a
    /// capture that makes its own reads and parses `/proc/self/maps`
    /// (about 600 µs, against 5–8 µs for the stack itself, on the machine
    /// of 2026-11-29), under the graph's lock, for every new nesting.
    static func captureSites() -> Backtrace? {
        try? Backtrace.capture(limit: 24, images: sharedImages)
    }

    /// The process's images, as the checker's first capture found them;
    /// a report symbolicates with a map taken then (`describe`), which
    /// also has any library loaded since.
    private static let sharedImages = ImageMap.capture()
}
