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
/// mode's arrays have room; only `.common` and invalidation build lists.
struct LoopModeTable {
    /// One mode's items. Each item is in it at most once.
    struct Items {
        let mode: LoopMode
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

    /// Every concrete mode used so far with its items. A mode keeps its slot
    /// for the table's life (a loop uses few modes), so slots never move.
    private(set) var modes: [Items] = []
    /// Where each mode of `modes` is.
    private var slots: [LoopMode: Int] = [:]
    /// The common-modes set.
    private(set) var commonModes: Set<LoopMode> = [.default]
    /// The record of `.common`.
    private(set) var common = Items(mode: .common)
    /// The loop this table belongs to, as sources record it.
    let loop: LoopIdentity

    init(loop: LoopIdentity) { self.loop = loop }

    // MARK: Modes

    /// `mode`'s items, if the mode was ever used (`.common` has none).
    func items(in mode: LoopMode) -> Items? {
        slot(mode).map { modes[$0] }
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
        modes.append(Items(mode: mode))
        slots[mode] = modes.count - 1
        return modes.count - 1
    }

    /// Calls `body` with the slot of every concrete mode that an item added
    /// to (or removed from) `mode` reaches: `mode` itself, or every common
    /// mode for `.common`. With `creating`, modes not used yet get a slot;
    /// without it they are skipped.
    private mutating func forEachSlot(reachedBy mode: LoopMode, creating: Bool, _ body: (inout Self, Int) -> Void) {
        if mode == .common {
            for m in commonModes {
                if let s = creating ? slotCreating(m) : slot(m) { body(&self, s) }
            }
        } else if let s = creating ? slotCreating(mode) : slot(mode) {
            body(&self, s)
        }
    }

    /// Adds `mode` to the common-modes set and gives it every item of the
    /// `.common` record. Returns the sources that joined it (for their
    /// `schedule` callbacks), or nil if `mode` was already common.
    mutating func addCommonMode(_ mode: LoopMode) -> [LoopSource]? {
        guard commonModes.insert(mode).inserted else { return nil }
        let slot = slotCreating(mode)
        var joined: [LoopSource] = []
        for s in common.sources where !modes[slot].sources.containsIdentical(s) && s.join(loop) {
            modes[slot].insert(s)
            joined.append(s)
        }
        for t in common.timers { modes[slot].insertIfAbsent(t) }
        for o in common.observers { modes[slot].insertIfAbsent(o) }
        return joined
    }

    // MARK: Sources

    /// Adds `source` to concrete mode `mode` unless it is there or was
    /// invalidated (recording the membership in the source). Returns
    /// whether it joined.
    mutating func insert(_ source: LoopSource, in mode: LoopMode) -> Bool {
        let slot = slotCreating(mode)
        guard !modes[slot].sources.containsIdentical(source), source.join(loop) else { return false }
        modes[slot].insert(source)
        return true
    }

    /// Adds `source` to the `.common` record and to every common mode that
    /// lacks it. Returns the modes it joined; none if it was invalidated.
    mutating func insertInCommonModes(_ source: LoopSource) -> [LoopMode] {
        var missing: [Int] = []
        forEachSlot(reachedBy: .common, creating: true) { table, slot in
            if !table.modes[slot].sources.containsIdentical(source) { missing.append(slot) }
        }
        // One join for them all, so that invalidation sees all or none.
        guard source.join(loop, modes: missing.count) else { return [] }
        if !common.sources.containsIdentical(source) { common.sources.append(source) }
        for slot in missing { modes[slot].insert(source) }
        return missing.map { modes[$0].mode }
    }

    /// Removes `source` from concrete mode `mode`. Returns whether it was
    /// there, and whether no mode of the loop holds it any more.
    mutating func remove(_ source: LoopSource, from mode: LoopMode) -> (left: Bool, leftLoop: Bool) {
        guard let slot = slot(mode), modes[slot].sources.removeIdentical(source) else { return (false, false) }
        return (true, source.leave(loop))
    }

    /// Removes `source` from the `.common` record and every common mode.
    /// Returns the modes it left, and whether no mode of the loop holds it
    /// any more.
    mutating func removeFromCommonModes(_ source: LoopSource) -> (left: [LoopMode], leftLoop: Bool) {
        _ = common.sources.removeIdentical(source)
        var left: [LoopMode] = []
        forEachSlot(reachedBy: .common, creating: false) { table, slot in
            if table.modes[slot].sources.removeIdentical(source) { left.append(table.modes[slot].mode) }
        }
        return (left, !left.isEmpty && source.leave(loop, modes: left.count))
    }

    /// Removes `source` from the `.common` record and every mode. Returns
    /// the modes it left.
    mutating func removeEverywhere(_ source: LoopSource) -> [LoopMode] {
        _ = common.sources.removeIdentical(source)
        var left: [LoopMode] = []
        for slot in modes.indices where modes[slot].sources.removeIdentical(source) {
            left.append(modes[slot].mode)
        }
        if !left.isEmpty { _ = source.leave(loop, modes: left.count) }
        return left
    }

    /// Whether `source` is in `mode` (for `.common`: in the record).
    func contains(_ source: LoopSource, inMode mode: LoopMode) -> Bool {
        if mode == .common { return common.sources.containsIdentical(source) }
        return slot(mode).map { modes[$0].sources.containsIdentical(source) } ?? false
    }

    // MARK: Timers

    /// Adds `timer` to `mode` (and the record, for `.common`), where absent.
    mutating func insert(_ timer: LoopTimer, in mode: LoopMode) {
        if mode == .common { common.insertIfAbsent(timer) }
        forEachSlot(reachedBy: mode, creating: true) { table, slot in table.modes[slot].insertIfAbsent(timer) }
    }

    /// Removes `timer` from `mode` (and the record, for `.common`).
    mutating func remove(_ timer: LoopTimer, from mode: LoopMode) {
        if mode == .common { _ = common.timers.removeIdentical(timer) }
        forEachSlot(reachedBy: mode, creating: false) { table, slot in _ = table.modes[slot].timers.removeIdentical(timer) }
    }

    /// Removes `timer` from the record and every mode.
    mutating func removeEverywhere(_ timer: LoopTimer) {
        _ = common.timers.removeIdentical(timer)
        for slot in modes.indices { _ = modes[slot].timers.removeIdentical(timer) }
    }

    // MARK: Observers

    /// Adds `observer` to `mode` (and the record, for `.common`), where absent.
    mutating func insert(_ observer: LoopObserver, in mode: LoopMode) {
        if mode == .common { common.insertIfAbsent(observer) }
        forEachSlot(reachedBy: mode, creating: true) { table, slot in table.modes[slot].insertIfAbsent(observer) }
    }

    /// Removes `observer` from `mode` (and the record, for `.common`).
    mutating func remove(_ observer: LoopObserver, from mode: LoopMode) {
        if mode == .common { _ = common.observers.removeIdentical(observer) }
        forEachSlot(reachedBy: mode, creating: false) { table, slot in _ = table.modes[slot].observers.removeIdentical(observer) }
    }

    /// Drops `mode`'s invalidated observers and returns those watching
    /// `activity`, in order.
    mutating func observers(in mode: LoopMode, watching activity: LoopActivity) -> [LoopObserver] {
        guard let slot = slot(mode), !modes[slot].observers.isEmpty else { return [] }
        modes[slot].observers.removeAll { !$0.isValid }
        return modes[slot].observers.filter { $0.activities.contains(activity) }
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
