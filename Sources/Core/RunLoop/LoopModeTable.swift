/// A loop's modes and the items in each: the bookkeeping behind
/// `ThreadLoop`'s add and remove calls, as one value that the loop keeps
/// under its lock. It knows nothing of locks, callbacks or wake-ups; the
/// loop calls it with its lock held and acts on what it returns.
///
/// Besides the concrete modes there is the record of `.common`: the items
/// added to `.common`, each of which is also in every common mode and joins
/// any mode added to the common set later.
///
/// Adding to or removing from one concrete mode allocates nothing once the
/// mode's arrays have room; only a change to several modes at once (through
/// `.common`, or invalidation) builds a list of them. A mode that is not
/// common is dropped when its last item leaves, so that modes a loop used
/// for a while (a modal run's own mode, say) leave nothing behind; adding
/// to it again allocates its arrays again.
struct LoopModeTable {
    /// One mode's items. Each item is in it at most once.
    struct Items {
        let mode: LoopMode
        /// Whether `mode` is in the common-modes set (which only grows), kept
        /// here so that dropping an emptied mode hashes no name.
        var isCommon = false
        /// Sorted by `order`, stable: equal orders stay in the order added.
        var sources: [LoopSource] = []
        var timers: [LoopTimer] = []
        /// Sorted by `order`, stable.
        var observers: [LoopObserver] = []

        /// Puts `source`, which is not here, in its place by `order`.
        mutating func insert(_ source: LoopSource) {
            let i = sources.firstIndex { $0.order > source.order } ?? sources.endIndex
            sources.insert(source, at: i)
        }

        mutating func insertIfAbsent(_ timer: LoopTimer) {
            if !timers.containsIdentical(timer) { timers.append(timer) }
        }

        mutating func insertIfAbsent(_ observer: LoopObserver) {
            guard !observers.containsIdentical(observer) else { return }
            let i = observers.firstIndex { $0.order > observer.order } ?? observers.endIndex
            observers.insert(observer, at: i)
        }
    }

    /// Every concrete mode that holds an item or is common (once used), with
    /// its items, in the order first used. Slots move only when an emptied
    /// mode is dropped (`dropIfEmpty`); nobody keeps one across calls.
    private(set) var modes: [Items] = []
    /// Where each mode of `modes` is.
    private var slots: [LoopMode: Int] = [:]
    /// The common-modes set.
    private(set) var commonModes: Set<LoopMode> = [.default]
    /// The record of `.common`.
    private(set) var common = Items(mode: .common)
    /// The loop this table belongs to, as sources record it.
    let identity: LoopIdentity

    init(for identity: LoopIdentity) { self.identity = identity }

    // MARK: Modes

    /// `mode`'s items, if it holds any or is a common mode that was used
    /// (`.common` has none). `mutating` though it changes nothing: the loop
    /// keeps its table in a class property, and a non-mutating call there
    /// copied the whole table first (every array, set and dictionary in it
    /// retained and released), a third of the time of a zero-timeout pass
    /// (measured: 1.12 µs a pass with it, 0.75 µs without).
    mutating func items(in mode: LoopMode) -> Items? {
        slot(mode).map { modes[$0] }
    }

    /// The modes that hold an item, and the common modes.
    var allModes: Set<LoopMode> {
        commonModes.union(modes.lazy.map(\.mode))
    }

    /// Drops the mode in `slot` if it holds nothing and is not common.
    private mutating func dropIfEmpty(_ slot: Int) {
        guard !modes[slot].isCommon && modes[slot].sources.isEmpty && modes[slot].timers.isEmpty
            && modes[slot].observers.isEmpty
        else { return }
        slots[modes.remove(at: slot).mode] = nil
        for moved in slot..<modes.count { slots[modes[moved].mode] = moved }
    }

    /// Drops every mode that holds nothing and is not common.
    private mutating func dropEmptyModes() {
        for slot in modes.indices.reversed() { dropIfEmpty(slot) }
    }

    /// Up to this many modes, `slot` compares names instead of hashing one.
    /// Measured here: a dictionary lookup of a short mode name costs 30–40
    /// ns, comparing two different short names about 4–5 ns, so a scan of
    /// six or fewer wins (and a loop rarely has more).
    private static let scanLimit = 6

    private func slot(_ mode: LoopMode) -> Int? {
        modes.count <= Self.scanLimit ? modes.firstIndex { $0.mode == mode } : slots[mode]
    }

    private mutating func slotCreating(_ mode: LoopMode) -> Int {
        if let slot = slot(mode) { return slot }
        modes.append(Items(mode: mode, isCommon: commonModes.contains(mode)))
        slots[mode] = modes.count - 1
        return modes.count - 1
    }

    /// Calls `body` with the items of every common mode; with `creating`,
    /// common modes not used yet are made, without it they are skipped.
    private mutating func forEachCommonMode(creating: Bool, _ body: (inout Items) -> Void) {
        for m in commonModes {
            if let s = creating ? slotCreating(m) : slot(m) { body(&modes[s]) }
        }
    }

    /// Applies `change` to the items of `mode`, or for `.common` to the
    /// record and every common mode. With `creating`, modes not used yet are
    /// made (for adding); without it they are skipped, and a mode the change
    /// emptied is dropped (for removing).
    private mutating func update(_ mode: LoopMode, creating: Bool, _ change: (inout Items) -> Void) {
        if mode == .common {
            change(&common)
            forEachCommonMode(creating: creating, change)
        } else if let s = creating ? slotCreating(mode) : slot(mode) {
            change(&modes[s])
            if !creating { dropIfEmpty(s) }
        }
    }

    /// Adds `mode` to the common-modes set and gives it every item of the
    /// `.common` record. Returns the sources that joined it (for their
    /// `schedule` callbacks), or nil if `mode` was already common.
    mutating func addCommonMode(_ mode: LoopMode) -> [LoopSource]? {
        guard commonModes.insert(mode).inserted else { return nil }
        let slot = slotCreating(mode)
        modes[slot].isCommon = true
        var joined: [LoopSource] = []
        for s in common.sources where !modes[slot].sources.containsIdentical(s) && s.join(identity) {
            modes[slot].insert(s)
            joined.append(s)
        }
        for t in common.timers { modes[slot].insertIfAbsent(t) }
        for o in common.observers { modes[slot].insertIfAbsent(o) }
        return joined
    }

    // MARK: Sources

    /// Adds `source` to `mode` (for `.common`: to the record and every common
    /// mode) wherever it is missing, unless it was invalidated. Records the
    /// membership in the source first, in one step, so that an invalidation
    /// sees all of it or none. Returns the modes it joined.
    mutating func insert(_ source: LoopSource, in mode: LoopMode) -> ChangedModes {
        guard mode == .common else {
            let slot = slotCreating(mode)
            guard !modes[slot].sources.containsIdentical(source), source.join(identity) else { return ChangedModes() }
            modes[slot].insert(source)
            return ChangedModes(mode)
        }
        var missing = 0
        forEachCommonMode(creating: true) { items in
            if !items.sources.containsIdentical(source) { missing += 1 }
        }
        guard source.join(identity, modes: missing) else { return ChangedModes() }
        if !common.sources.containsIdentical(source) { common.sources.append(source) }
        var joined = ChangedModes()
        forEachCommonMode(creating: false) { items in
            guard !items.sources.containsIdentical(source) else { return }
            items.insert(source)
            joined.append(items.mode)
        }
        return joined
    }

    /// Removes `source` from `mode` (for `.common`: from the record and every
    /// common mode). Returns the modes it left, and whether no mode of the
    /// loop holds it any more.
    mutating func remove(_ source: LoopSource, from mode: LoopMode) -> (left: ChangedModes, leftLoop: Bool) {
        guard mode == .common else {
            guard let slot = slot(mode), modes[slot].sources.removeIdentical(source) else { return (ChangedModes(), false) }
            dropIfEmpty(slot)
            return (ChangedModes(mode), source.leave(identity))
        }
        _ = common.sources.removeIdentical(source)
        var left = ChangedModes()
        forEachCommonMode(creating: false) { items in
            if items.sources.removeIdentical(source) { left.append(items.mode) }
        }
        return (left, !left.isEmpty && source.leave(identity, modes: left.count))
    }

    /// Removes `source` from the `.common` record and every mode. Returns
    /// the modes it left.
    mutating func removeEverywhere(_ source: LoopSource) -> ChangedModes {
        _ = common.sources.removeIdentical(source)
        var left = ChangedModes()
        for slot in modes.indices where modes[slot].sources.removeIdentical(source) {
            left.append(modes[slot].mode)
        }
        if !left.isEmpty {
            _ = source.leave(identity, modes: left.count)
            dropEmptyModes()
        }
        return left
    }

    /// Removes every source from every mode and from the `.common` record
    /// (the loop's thread has exited). Returns each source with the modes it
    /// left, in the order the modes were first used and, within a mode, in
    /// firing order.
    mutating func removeAllSources() -> [(LoopSource, ChangedModes)] {
        var removed: [(LoopSource, ChangedModes)] = []
        var position: [ObjectIdentifier: Int] = [:]
        for slot in modes.indices {
            for source in modes[slot].sources {
                if let i = position[ObjectIdentifier(source)] {
                    removed[i].1.append(modes[slot].mode)
                } else {
                    position[ObjectIdentifier(source)] = removed.count
                    removed.append((source, ChangedModes(modes[slot].mode)))
                }
            }
            modes[slot].sources.removeAll()
        }
        common.sources.removeAll()
        for (source, left) in removed { _ = source.leave(identity, modes: left.count) }
        return removed
    }

    /// Whether `source` is in `mode` (for `.common`: in the record).
    func contains(_ source: LoopSource, inMode mode: LoopMode) -> Bool {
        if mode == .common { return common.sources.containsIdentical(source) }
        return slot(mode).map { modes[$0].sources.containsIdentical(source) } ?? false
    }

    // MARK: Timers and observers

    /// Adds `timer` to `mode` (and the record, for `.common`), where absent.
    mutating func insert(_ timer: LoopTimer, in mode: LoopMode) {
        update(mode, creating: true) { $0.insertIfAbsent(timer) }
    }

    /// Removes `timer` from `mode` (and the record, for `.common`).
    mutating func remove(_ timer: LoopTimer, from mode: LoopMode) {
        update(mode, creating: false) { _ = $0.timers.removeIdentical(timer) }
    }

    /// Removes `timer` from the record and every mode.
    mutating func removeEverywhere(_ timer: LoopTimer) {
        _ = common.timers.removeIdentical(timer)
        // Backwards, so that dropping a mode moves only slots already visited.
        for slot in modes.indices.reversed() where modes[slot].timers.removeIdentical(timer) { dropIfEmpty(slot) }
    }

    /// Adds `observer` to `mode` (and the record, for `.common`), where absent.
    mutating func insert(_ observer: LoopObserver, in mode: LoopMode) {
        update(mode, creating: true) { $0.insertIfAbsent(observer) }
    }

    /// Removes `observer` from `mode` (and the record, for `.common`).
    mutating func remove(_ observer: LoopObserver, from mode: LoopMode) {
        update(mode, creating: false) { _ = $0.observers.removeIdentical(observer) }
    }

    /// Empties every mode and the record of timers and observers (for a loop
    /// whose thread has exited); returns the timers, each once.
    mutating func removeAllTimersAndObservers() -> [LoopTimer] {
        var timers = common.timers
        for slot in modes.indices {
            for timer in modes[slot].timers where !timers.containsIdentical(timer) { timers.append(timer) }
            modes[slot].timers.removeAll()
            modes[slot].observers.removeAll()
        }
        common.timers.removeAll()
        common.observers.removeAll()
        dropEmptyModes()
        return timers
    }

    /// Drops `mode`'s invalidated observers and returns the others, in
    /// order: the mode's own array, so a pass copies nothing unless the
    /// mode changes while the caller holds it.
    mutating func observers(in mode: LoopMode) -> [LoopObserver] {
        guard let slot = slot(mode), !modes[slot].observers.isEmpty else { return [] }
        if modes[slot].observers.contains(where: { !$0.isValid }) {
            modes[slot].observers.removeAll { !$0.isValid }
            let remaining = modes[slot].observers
            if remaining.isEmpty { dropIfEmpty(slot) }
            return remaining
        }
        return modes[slot].observers
    }
}

/// The modes an add or remove changed. Usually one, which is held without
/// an array, so that the common case allocates nothing.
struct ChangedModes {
    private var first: LoopMode?
    private var more: [LoopMode]?

    /// None.
    init() {}
    /// Just `mode`.
    init(_ mode: LoopMode) { first = mode }

    var isEmpty: Bool { first == nil }
    var count: Int { first == nil ? 0 : 1 + (more?.count ?? 0) }

    mutating func append(_ mode: LoopMode) {
        if first == nil {
            first = mode
        } else if more == nil {
            more = [mode]
        } else {
            more!.append(mode)
        }
    }

    /// Calls `body` with each mode, in the order appended.
    func forEach(_ body: (LoopMode) -> Void) {
        guard let first else { return }
        body(first)
        more?.forEach(body)
    }
}

extension Array where Element: AnyObject {
    /// Whether the array holds `object` itself (not merely an equal one).
    func containsIdentical(_ object: Element) -> Bool {
        contains { $0 === object }
    }

    /// Removes the first occurrence of `object` itself; returns whether there
    /// was one. Keeps the order of the rest.
    mutating func removeIdentical(_ object: Element) -> Bool {
        guard let i = firstIndex(where: { $0 === object }) else { return false }
        remove(at: i)
        return true
    }
}
