/// A pool worker's local run queue: a ring of units that its owner pushes
/// at the back and pops at the front without a lock, and from which other
/// workers steal the older half. The index protocol is Tokio's local queue;
/// unlike Tokio's (and Go's `runq`), which hand half of a full ring to the
/// shared injector, this one grows, so a worker's own submissions start in
/// the order it made them however many it makes.
///
/// ## Indices
/// Two 32-bit counters that only grow (wrapping): `tail`, the next slot the
/// owner fills, written by the owner alone; and `head`, one 64-bit word
/// packing two counters that the owner and thieves change by
/// compare-and-swap:
/// - `real`: the next unit to run. A pop advances it by one, a steal's
///   claim by the number it takes.
/// - `steal`: the first unit a thief is still copying out. Equal to `real`
///   when no steal is in progress; a thief sets it back equal once it has
///   copied its units (the commit). The owner measures free room from
///   `steal`, so it never overwrites a slot that a thief is still reading,
///   which is what lets a slot be 32 bytes (a closure and a reference)
///   rather than one word.
///
/// At most one steal runs at a time per ring (a thief that finds one in
/// progress tries another victim).
///
/// ## Growth
/// A full ring (counting slots a thief is still copying) doubles: the owner
/// copies the live units' bits into a new buffer at the same indices and
/// publishes it. A thief reads the buffer after `tail`, so it always sees a
/// buffer that holds every unit that `tail` covers; one that read the old
/// buffer may still copy from it, so a replaced buffer is kept until the
/// ring is freed (Chase and Lev's deque makes the same trade). Together the
/// replaced buffers are smaller than the current one: a worker's backlog
/// peak costs at most twice its size, for the worker's life, as the locked
/// ring this replaced kept its largest buffer.
///
/// ## Cost
/// A push is one sequentially consistent store (the pool's wake-up check
/// pairs with it, see `PoolWorker.park`); a pop one compare-and-swap on a
/// line that thieves write only while stealing. The locked ring this
/// replaced took a lock, published a count and unlocked on each: six atomic
/// read-modify-writes per unit instead of two. A thief never takes a lock
/// that the owner's next push or pop needs.
///
/// ## Ordering
/// The owner's slot writes happen before its sequentially consistent store
/// of `tail`, which a thief reads with acquire ordering before it copies; a
/// thief's copies happen before its releasing commit, which the owner reads
/// with acquire ordering before it reuses a slot; a buffer's contents happen
/// before its releasing publication, which a thief reads with acquire
/// ordering.
final class StealableRing {
    /// The first buffer's size in units (a power of two).
    static let initialCapacity = 256

    /// `head` (8 bytes at 0), `tail` (4 bytes at 8) and the current buffer's
    /// address (8 bytes at 16) on one cache line: the owner writes the
    /// first two on every unit, thieves `head` only while stealing.
    private let words: UnsafeMutableRawPointer

    private var head: UnsafeMutablePointer<UInt64> { words.assumingMemoryBound(to: UInt64.self) }
    private var tail: UnsafeMutablePointer<UInt32> { (words + 8).assumingMemoryBound(to: UInt32.self) }
    private var bufferWord: UnsafeMutablePointer<UInt64> { (words + 16).assumingMemoryBound(to: UInt64.self) }

    /// The owner's view of the current buffer (the owner alone replaces it).
    private var slots: UnsafeMutablePointer<WorkUnit>
    private var mask: UInt32
    /// Buffers replaced by growth, freed with the ring. Owner only.
    private var replaced: [UnsafeMutableRawPointer] = []

    /// The index word block, for pollers that read the count without the
    /// ring object (`queuedCount(words:)`).
    var indexWords: UnsafeMutableRawPointer { words }

    init() {
        words = allocateStableWords(byteCount: 64)
        let buffer = Self.allocateBuffer(capacity: Self.initialCapacity)
        slots = Self.slots(of: buffer)
        mask = UInt32(Self.initialCapacity - 1)
        AtomicMemory.store(UInt64(UInt(bitPattern: buffer)), to: bufferWord, ordering: .relaxed)
    }

    deinit {
        let (steal, _) = Self.unpack(AtomicMemory.load(from: head, ordering: .acquiring))
        let end = AtomicMemory.load(from: tail, ordering: .relaxed)
        var index = steal
        while index != end {
            (slots + Int(index & mask)).deinitialize(count: 1)
            index &+= 1
        }
        currentBuffer.deallocate()
        for buffer in replaced { buffer.deallocate() }
        deallocateStableWords(words)
    }

    // MARK: Buffers

    /// A buffer: its capacity in the first word, the slots from byte 32
    /// (a unit's alignment is 8; 32 keeps the slots on the unit's stride).
    private static let slotsOffset = 32

    private static func allocateBuffer(capacity: Int) -> UnsafeMutableRawPointer {
        let buffer = UnsafeMutableRawPointer.allocate(
            byteCount: slotsOffset + capacity * MemoryLayout<WorkUnit>.stride, alignment: 64)
        buffer.storeBytes(of: capacity, as: Int.self)
        return buffer
    }

    @inline(__always)
    private static func slots(of buffer: UnsafeMutableRawPointer) -> UnsafeMutablePointer<WorkUnit> {
        (buffer + slotsOffset).assumingMemoryBound(to: WorkUnit.self)
    }

    private var currentBuffer: UnsafeMutableRawPointer {
        UnsafeMutableRawPointer(slots) - Self.slotsOffset
    }

    /// Doubles the buffer: the live units (from `steal`, so that units a
    /// thief is copying stay where its buffer has them) move, as bits, to
    /// the same indices of the new one, which is then published. Owner only.
    private func grow(from steal: UInt32, to end: UInt32) {
        let capacity = Int(mask) + 1
        let bigger = Self.allocateBuffer(capacity: capacity * 2)
        let newSlots = Self.slots(of: bigger)
        let newMask = UInt32(capacity * 2 - 1)
        var index = steal
        while index != end {
            // A bitwise copy: a thief that read the old buffer may copy the
            // same bits; whoever claimed the index owns the unit.
            UnsafeMutableRawPointer(newSlots + Int(index & newMask)).copyMemory(
                from: UnsafeRawPointer(slots + Int(index & mask)), byteCount: MemoryLayout<WorkUnit>.stride)
            index &+= 1
        }
        replaced.append(currentBuffer)
        slots = newSlots
        mask = newMask
        // Releasing: the copies happen before a thief that reads this
        // address reads the slots.
        AtomicMemory.store(UInt64(UInt(bitPattern: bigger)), to: bufferWord, ordering: .releasing)
    }

    @inline(__always)
    private static func unpack(_ word: UInt64) -> (steal: UInt32, real: UInt32) {
        (UInt32(truncatingIfNeeded: word >> 32), UInt32(truncatingIfNeeded: word))
    }

    @inline(__always)
    private static func pack(steal: UInt32, real: UInt32) -> UInt64 {
        UInt64(steal) << 32 | UInt64(real)
    }

    // MARK: Any thread

    /// Units queued and not claimed, read from any thread through the index
    /// words (stale at once; sequentially consistent loads by default, for
    /// the pool's wake-up checks). `head` is read first: `real` never passes
    /// the `tail` of the same moment, and `tail` only grows, so the
    /// difference is never negative.
    @inline(__always)
    static func queuedCount(words: UnsafeMutableRawPointer, ordering: AtomicMemory.Ordering = .sequentiallyConsistent) -> Int {
        let head = AtomicMemory.load(from: words.assumingMemoryBound(to: UInt64.self), ordering: ordering)
        let tail = AtomicMemory.load(from: (words + 8).assumingMemoryBound(to: UInt32.self), ordering: ordering)
        return Int(tail &- unpack(head).real)
    }

    /// `queuedCount(words:)` of this ring.
    @inline(__always)
    var count: Int { Self.queuedCount(words: words) }

    /// Moves up to half of the queued units (rounded up, at most `limit`)
    /// from the front into `buffer`, oldest first; returns how many. Called
    /// by thieves (any thread but the owner). Returns 0 if the ring is empty
    /// or another steal is in progress.
    func steal(into buffer: UnsafeMutablePointer<WorkUnit>, limit: Int) -> Int {
        var word = AtomicMemory.load(from: head, ordering: .acquiring)
        var first: UInt32
        var taken: UInt32
        var claimed: UInt64
        var source: UnsafeMutableRawPointer
        while true {
            let (steal, real) = Self.unpack(word)
            if steal != real { return 0 }
            // Acquiring: the owner's slot writes before this tail are
            // visible, and so is the buffer they were written to (published
            // before them), which is read after it.
            let end = AtomicMemory.load(from: tail, ordering: .acquiring)
            let queued = end &- real
            if queued == 0 || queued > UInt32(Int32.max) { return 0 }
            source = UnsafeMutableRawPointer(bitPattern: UInt(AtomicMemory.load(from: bufferWord, ordering: .acquiring)))
                .unsafelyUnwrapped
            taken = min(queued - queued / 2, UInt32(limit))
            claimed = Self.pack(steal: steal, real: real &+ taken)
            let (exchanged, found) = AtomicMemory.compareExchange(
                expected: word, desired: claimed, at: head, ordering: .acquiringAndReleasing)
            if exchanged {
                first = real
                break
            }
            word = found
        }
        let sourceSlots = Self.slots(of: source)
        let sourceMask = UInt32(source.load(as: Int.self) - 1)
        for i in 0..<Int(taken) {
            UnsafeMutableRawPointer(buffer + i).copyMemory(
                from: UnsafeRawPointer(sourceSlots + Int((first &+ UInt32(i)) & sourceMask)),
                byteCount: MemoryLayout<WorkUnit>.stride)
        }
        // Commit: `steal` catches up with `real` (which the owner's pops
        // may have moved meanwhile). Releasing: the copies above happen
        // before the owner reuses those slots.
        word = claimed
        while true {
            let real = Self.unpack(word).real
            let (exchanged, found) = AtomicMemory.compareExchange(
                expected: word, desired: Self.pack(steal: real, real: real), at: head, ordering: .acquiringAndReleasing)
            if exchanged { return Int(taken) }
            word = found
        }
    }

    // MARK: Owner only

    /// Whether the owner sees nothing queued (a thief may still be copying
    /// units it claimed; those are no longer queued).
    @inline(__always)
    var isEmptyForOwner: Bool {
        AtomicMemory.load(from: tail, ordering: .relaxed) == Self.unpack(AtomicMemory.load(from: head, ordering: .relaxed)).real
    }

    /// Appends at the back, growing the buffer if it is full. Owner only.
    @inline(__always)
    func push(_ unit: consuming WorkUnit) {
        // Acquiring: a thief's copies out of the slot reused here happen
        // before this write (its releasing commit).
        let steal = Self.unpack(AtomicMemory.load(from: head, ordering: .acquiring)).steal
        let end = AtomicMemory.load(from: tail, ordering: .relaxed)
        if end &- steal > mask { grow(from: steal, to: end) }
        (slots + Int(end & mask)).initialize(to: unit)
        AtomicMemory.store(end &+ 1, to: tail, ordering: .sequentiallyConsistent)
    }

    /// Appends `count` units moved out of `units`, in order, with one
    /// store of `tail` for all of them (a batch taken by a steal or from
    /// the injector). Owner only.
    func push(movingFrom units: UnsafeMutablePointer<WorkUnit>, count: Int) {
        guard count > 0 else { return }
        let steal = Self.unpack(AtomicMemory.load(from: head, ordering: .acquiring)).steal
        let end = AtomicMemory.load(from: tail, ordering: .relaxed)
        while Int(end &- steal) + count > Int(mask) + 1 { grow(from: steal, to: end) }
        for i in 0..<count {
            (slots + Int((end &+ UInt32(i)) & mask)).initialize(to: (units + i).move())
        }
        AtomicMemory.store(end &+ UInt32(count), to: tail, ordering: .sequentiallyConsistent)
    }

    /// Removes the front unit. Owner only.
    @inline(__always)
    func pop() -> WorkUnit? {
        var word = AtomicMemory.load(from: head, ordering: .acquiring)
        while true {
            let (steal, real) = Self.unpack(word)
            if real == AtomicMemory.load(from: tail, ordering: .relaxed) { return nil }
            let next = real &+ 1
            // With no steal in progress both counters move; otherwise the
            // thief's `steal` stays until its commit.
            let desired = steal == real ? Self.pack(steal: next, real: next) : Self.pack(steal: steal, real: next)
            let (exchanged, found) = AtomicMemory.compareExchange(
                expected: word, desired: desired, at: head, ordering: .acquiringAndReleasing)
            if exchanged { return (slots + Int(real & mask)).move() }
            word = found
        }
    }

    /// Inserts at the front, to run next. The slot before `real` may be one
    /// a thief is copying out, so this needs no steal in progress; it waits
    /// a short while for one to commit (a copy of at most
    /// `PoolWorker.stealLimit` units) and gives the unit back if it has not
    /// (a thief preempted mid-copy). Owner only.
    func pushFront(_ unit: consuming WorkUnit) -> WorkUnit? {
        var pending: WorkUnit? = consume unit
        for _ in 0..<256 {
            let word = AtomicMemory.load(from: head, ordering: .acquiring)
            let (steal, real) = Self.unpack(word)
            if steal != real {
                spinLoopHint()
                continue
            }
            let end = AtomicMemory.load(from: tail, ordering: .relaxed)
            if end &- real > mask { grow(from: steal, to: end) }
            let index = real &- 1
            (slots + Int(index & mask)).initialize(to: pending.take().unsafelyUnwrapped)
            // Sequentially consistent, as a push's store of `tail`.
            if AtomicMemory.compareAndSwap(
                expected: word, desired: Self.pack(steal: index, real: index), at: head, ordering: .sequentiallyConsistent)
            {
                return nil
            }
            // A pop or a steal came first: take the unit back and retry.
            pending = (slots + Int(index & mask)).move()
        }
        return pending
    }

    /// In a child after `fork()`, where only the forking thread is left: a
    /// steal that a parent thread had claimed but not committed never will,
    /// so its units are queued again (a thief's copy leaves the slot's bits
    /// in place, and the copies died with it).
    func reclaimAfterFork() {
        let steal = Self.unpack(AtomicMemory.load(from: head, ordering: .relaxed)).steal
        AtomicMemory.store(Self.pack(steal: steal, real: steal), to: head, ordering: .relaxed)
    }
}
