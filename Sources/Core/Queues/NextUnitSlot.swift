/// A pool worker's next-unit slot (Go's `runnext`, Tokio's LIFO slot): one
/// unit that its owner submitted while its ring was empty, run next by the
/// owner without a wake-up, so that a chain of items stays on one warm
/// worker; and that another worker may take once it has sat there for a
/// wake-up or `PoolWorker.slotGrace` (Go's `runqgrab`, which steals
/// `runnext` from a running P after a 3 µs back-off), so that it does not
/// wait for its owner's item to return while a worker is free.
///
/// ## The word
/// One 64-bit word, `sequence << 2 | state`, beside the unit's 32 bytes on
/// the owner's own cache line:
///
/// | state | meaning                                              |
/// |-------|------------------------------------------------------|
/// | 0     | empty: the owner may fill it                         |
/// | 1     | full: the owner or a thief may claim it              |
/// | 2     | a thief is copying the unit out; then empty          |
///
/// `sequence` grows with every fill, so a thief that saw a full slot and
/// claims it a grace period later takes that same unit or nothing: a
/// compare-and-swap against the word it saw fails if the owner has taken
/// the unit and filled the slot again meanwhile.
///
/// ## Cost
/// A fill is one releasing store (a plain store on x86_64), and a
/// sequentially consistent fence when it is announced; the owner's take
/// one compare-and-swap, on a line that thieves read only while searching
/// and write only when they claim. Against the owner-private slot this
/// replaced, that is one atomic read-modify-write per chained unit.
///
/// ## Announcing
/// A fill is announced (a parked worker woken if nobody searches, see
/// `announcesFill`) while such wake-ups find the unit still there; each
/// woken worker that finds it already taken back by its owner doubles a
/// back-off, up to 4,096 fills between two announced ones, and the pool's
/// monitor clears it at each look (every 10 ms while the pool is busy).
/// A chain of short items thus wakes a parked worker rarely, and an item
/// that keeps computing after an unannounced fill loses the unit to a free
/// worker when the monitor finds it sitting there a period later.
///
/// ## Ordering
/// The owner writes the unit before its releasing fill, which a thief's
/// acquiring claim reads before it copies; a thief's copy happens
/// before its releasing store of "empty", which the owner's acquiring load
/// reads before it writes the next unit there.
final class NextUnitSlot {
    /// The word at 0, the unit from byte 8, the announcement back-off at 48
    /// (see `announcesFill`).
    private let words: UnsafeMutableRawPointer

    private static let empty: UInt64 = 0
    private static let full: UInt64 = 1
    private static let copying: UInt64 = 2
    private static let stateMask: UInt64 = 3

    init() {
        words = allocateStableWords(byteCount: 56)
    }

    deinit {
        if AtomicMemory.load(from: word, ordering: .acquiring) & Self.stateMask != Self.empty {
            unit.deinitialize(count: 1)
        }
        deallocateStableWords(words)
    }

    private var word: UnsafeMutablePointer<UInt64> { words.assumingMemoryBound(to: UInt64.self) }
    /// Fills to let pass unannounced between two announced ones: 0 while
    /// the wake-ups that fills bring find work; doubled (up to
    /// `maximumBackoff`) by each worker that, woken for a fill, found its
    /// unit already taken back by the owner. Written by those workers,
    /// read by the owner at each fill; relaxed (a hint).
    private var backoffWord: UnsafeMutablePointer<Int> { (words + 48).assumingMemoryBound(to: Int.self) }
    /// Fills since the last announced one. Owner only.
    private var unannounced = 0

    /// At most this many fills pass unannounced: a chain of short items
    /// wakes a parked worker once per 4,096 links (about 0.4 ms of links
    /// here) instead of once per thief's cycle.
    static let maximumBackoff = 4096
    private var unit: UnsafeMutablePointer<WorkUnit> { (words + 8).assumingMemoryBound(to: WorkUnit.self) }

    // MARK: Owner only

    /// Places `unit` in the slot if it is empty; otherwise gives it back.
    @inline(__always)
    func fill(_ unit: consuming WorkUnit) -> WorkUnit? {
        // Acquiring: a thief's copy out of the slot happens before this
        // write (its releasing store of "empty").
        let seen = AtomicMemory.load(from: word, ordering: .acquiring)
        guard seen & Self.stateMask == Self.empty else { return unit }
        self.unit.initialize(to: unit)
        // Releasing: pairs with a thief's acquiring claim. The submitter's
        // wake-up check after an announced fill starts with a sequentially
        // consistent fence (`WorkerPool.submit`), which makes this store
        // the other half of a parking worker's give-back-then-look (see
        // `PoolWorker.park`); an unannounced fill needs no such order (the
        // monitor finds it).
        AtomicMemory.store((seen & ~Self.stateMask) &+ 4 | Self.full, to: word, ordering: .releasing)
        return nil
    }

    /// Takes the unit, unless the slot is empty or a thief claimed it.
    @inline(__always)
    func take() -> WorkUnit? {
        let seen = AtomicMemory.load(from: word, ordering: .relaxed)
        guard seen & Self.stateMask == Self.full,
              AtomicMemory.compareAndSwap(
                expected: seen, desired: seen & ~Self.stateMask, at: word, ordering: .relaxed)
        else { return nil }
        // The owner wrote the unit itself: no ordering needed to read it.
        return unit.move()
    }

    /// Whether the fill just made should wake a parked worker (if the pool
    /// has one and nobody searches): every fill while wake-ups for this
    /// slot find work, else one in `backoff + 1`. A fill left unannounced
    /// is the monitor's to find (`PoolMonitor`), if its owner keeps
    /// running. Owner only.
    @inline(__always)
    func announcesFill() -> Bool {
        let backoff = AtomicMemory.load(from: backoffWord, ordering: .relaxed)
        if backoff == 0 { return true }
        unannounced += 1
        if unannounced <= backoff { return false }
        unannounced = 0
        return true
    }

    /// A worker woken for a fill reports whether the unit was still there
    /// for it (the wake-up found work) or the owner had taken it back.
    func noteWakeUp(foundWork: Bool) {
        let backoff = AtomicMemory.load(from: backoffWord, ordering: .relaxed)
        let next = foundWork ? 0 : min(max(1, backoff * 2), Self.maximumBackoff)
        if next != backoff { AtomicMemory.store(next, to: backoffWord, ordering: .relaxed) }
    }

    /// Forgets the back-off (the monitor, at each look): a chain re-grows
    /// it within a dozen wasted wake-ups, and a back-off left by a chain
    /// that ended cannot hold back a later fill for more than a period.
    func resetBackoff() {
        if AtomicMemory.load(from: backoffWord, ordering: .relaxed) != 0 {
            AtomicMemory.store(0, to: backoffWord, ordering: .relaxed)
        }
    }

    /// Whether the slot holds a unit, as its owner sees it.
    @inline(__always)
    var isFullForOwner: Bool { AtomicMemory.load(from: word, ordering: .relaxed) & Self.stateMask == Self.full }

    // MARK: Any thread

    /// The slot's word if it holds a unit, else nil (stale at once;
    /// sequentially consistent, for the pool's wake-up checks).
    @inline(__always)
    var fullWord: UInt64? {
        let seen = AtomicMemory.load(from: word, ordering: .sequentiallyConsistent)
        return seen & Self.stateMask == Self.full ? seen : nil
    }

    /// A thief's claim: takes the unit if the word is still `seen` (the
    /// same fill, not yet taken). Any thread but the owner.
    func steal(ifStill seen: UInt64) -> WorkUnit? {
        let base = seen & ~Self.stateMask
        // Acquiring: pairs with the owner's fill, so the unit's bytes are
        // visible before the copy below.
        guard AtomicMemory.compareAndSwap(
            expected: seen, desired: base | Self.copying, at: word, ordering: .acquiringAndReleasing)
        else { return nil }
        let taken = unit.move()
        // Releasing: the copy above happens before the owner refills.
        AtomicMemory.store(base | Self.empty, to: word, ordering: .releasing)
        return taken
    }

    /// In a child after `fork()`: a thief of the parent that was copying
    /// the unit out is gone, and its copy with it; the unit is the slot's
    /// again (a move leaves the bits in place).
    func reclaimAfterFork() {
        let seen = AtomicMemory.load(from: word, ordering: .relaxed)
        if seen & Self.stateMask == Self.copying {
            AtomicMemory.store(seen & ~Self.stateMask | Self.full, to: word, ordering: .relaxed)
        }
    }
}
