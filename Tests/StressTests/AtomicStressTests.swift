import Spindle
import Testing
import TestSupport

/// Counters shared by the racing threads, each on its own cache line.
private final class SharedCounters: @unchecked Sendable {
    // @unchecked: every field is accessed only through AtomicMemory.
    static let lineWords = 8
    let base = UnsafeMutablePointer<UInt64>.allocate(capacity: 8 * lineWords)
    init() { base.initialize(repeating: 0, count: 8 * Self.lineWords) }
    deinit { base.deallocate() }
    /// Word `i` as UInt64; `int32(i)` views its low half as an Int32.
    func word(_ i: Int) -> UnsafeMutablePointer<UInt64> { base + i * Self.lineWords }
    func int32(_ i: Int) -> UnsafeMutablePointer<Int32> {
        UnsafeMutableRawPointer(word(i)).assumingMemoryBound(to: Int32.self)
    }
    func int64(_ i: Int) -> UnsafeMutablePointer<Int64> {
        UnsafeMutableRawPointer(word(i)).assumingMemoryBound(to: Int64.self)
    }
}

@Suite("AtomicMemory stress")
struct AtomicStressTests {
    /// Threads × 10^6 mixed operations each on shared words (the issue's
    /// count, also CI's; 10^7 at full size); afterwards every counter holds
    /// exactly the sum of what the threads did, so no update was lost.
    @Test(arguments: [2, 8])
    func mixedOperationsLoseNothing(threads: Int) {
        let opsPerThread = stressSize(ci: 1_000_000, full: 10_000_000)
        let c = SharedCounters()
        // Per-thread tallies of what each did to the additive counters.
        let tallies = UnsafeMutablePointer<Int64>.allocate(capacity: threads * 4)
        tallies.initialize(repeating: 0, count: threads * 4)
        defer { tallies.deallocate() }
        let tallyBox = SharedPointer(tallies)
        let failures = SharedCounters()

        runThreads(threads) { t in
            var rng = SplitMix(state: UInt64(t + 1) &* 0x1234_5678)
            var add32: Int64 = 0, add64: Int64 = 0, cas: Int64 = 0
            let myBit = UInt64(1) << UInt64(t)  // word 3: each thread owns one bit
            let myMask32 = UInt32(1) << UInt32(t) // word 4, low half
            let word4 = UnsafeMutableRawPointer(c.word(4)).assumingMemoryBound(to: UInt32.self)
            for i in 0..<opsPerThread {
                let ordering: AtomicMemory.Ordering = i & 1 == 0 ? .relaxed : .barrier
                switch rng.next() % 8 {
                case 0:
                    let d = Int32(truncatingIfNeeded: rng.next() % 1000) - 500
                    AtomicMemory.add(d, to: c.int32(0), ordering: ordering)
                    add32 += Int64(d)
                case 1:
                    AtomicMemory.increment(c.int32(0), ordering: ordering); add32 += 1
                case 2:
                    AtomicMemory.decrement(c.int64(1), ordering: ordering); add64 &-= 1
                case 3:
                    let d = Int64(truncatingIfNeeded: rng.next() >> 20)
                    // Up to 2^44 each: 10^7 of them pass Int64.max, so the
                    // tally wraps as the shared word does.
                    AtomicMemory.add(d, to: c.int64(1), ordering: ordering); add64 &+= d
                case 4:
                    // CAS loop increment.
                    var seen = AtomicMemory.load(from: c.int64(2))
                    while true {
                        let r = AtomicMemory.compareExchange(expected: seen, desired: seen + 1, at: c.int64(2), ordering: ordering)
                        if r.exchanged { break }
                        seen = r.original
                    }
                    cas += 1
                case 5:
                    // Set then clear our own bit: nobody else touches it, so
                    // the values we see must say it was clear, then set.
                    let before = AtomicMemory.orOriginal(myBit, into: c.word(3), ordering: ordering)
                    let after = AtomicMemory.and(~myBit, into: c.word(3), ordering: ordering)
                    if before & myBit != 0 || after & myBit != 0 { AtomicMemory.increment(failures.word(0)) }
                case 6:
                    // XOR twice restores; the new value shows our bit toggled.
                    let a = AtomicMemory.xor(myMask32, into: word4, ordering: ordering)
                    let b = AtomicMemory.xorOriginal(myMask32, into: word4, ordering: ordering)
                    if a & myMask32 == 0 || b & myMask32 == 0 { AtomicMemory.increment(failures.word(0)) }
                default:
                    let v = AtomicMemory.exchange(UInt64(t), at: c.word(5), ordering: ordering)
                    if v >= UInt64(threads) { AtomicMemory.increment(failures.word(0)) }
                }
            }
            tallyBox.pointer[t * 4] = add32
            tallyBox.pointer[t * 4 + 1] = add64
            tallyBox.pointer[t * 4 + 2] = cas
        }

        let expected32 = (0..<threads).reduce(Int64(0)) { $0 + tallies[$1 * 4] }
        let expected64 = (0..<threads).reduce(Int64(0)) { $0 &+ tallies[$1 * 4 + 1] }
        let expectedCAS = (0..<threads).reduce(Int64(0)) { $0 + tallies[$1 * 4 + 2] }
        #expect(AtomicMemory.load(from: c.int32(0), ordering: .barrier) == Int32(truncatingIfNeeded: expected32))
        #expect(AtomicMemory.load(from: c.int64(1), ordering: .barrier) == expected64)
        #expect(AtomicMemory.load(from: c.int64(2), ordering: .barrier) == expectedCAS)
        #expect(AtomicMemory.load(from: c.word(3), ordering: .barrier) == 0, "every set bit was cleared")
        #expect(AtomicMemory.load(from: c.word(4), ordering: .barrier) == 0, "every xor was undone")
        #expect(AtomicMemory.load(from: failures.word(0), ordering: .barrier) == 0, "a thread saw a torn or foreign value")
        // Every operation checks what it saw (or feeds an exact total): one check each, plus the six totals.
        StressReport.record(operations: threads * opsPerThread, threads: threads, checks: threads * opsPerThread + 6)
    }

    /// 64 threads race test-and-set over a 4096-bit field: each bit is won by
    /// exactly one thread (its test-and-set returned false), and every bit
    /// ends up set.
    @Test func testAndSetEveryBitWonExactlyOnce() {
        let bits = 4096
        let threads = 64
        // Fields raced over, one after another (each a fresh race).
        let fields = stressSize(ci: 1, full: 20)
        for _ in 0..<fields { raceOneField(bits: bits, threads: threads) }
        // Each bit checked for a single win, and each field's bytes checked full.
        StressReport.record(operations: fields * bits * threads, threads: threads, checks: fields * (bits + bits / 8))
    }

    private func raceOneField(bits: Int, threads: Int) {
        let field = UnsafeMutableRawBufferPointer.allocate(byteCount: bits / 8, alignment: 8)
        field.initializeMemory(as: UInt8.self, repeating: 0)
        defer { field.deallocate() }
        let wins = UnsafeMutablePointer<UInt32>.allocate(capacity: bits)
        wins.initialize(repeating: 0, count: bits)
        defer { wins.deallocate() }
        let fieldBase = SharedPointer(field.baseAddress!.assumingMemoryBound(to: UInt8.self))
        let winsBox = SharedPointer(wins)

        runThreads(threads) { t in
            let buffer = UnsafeMutableRawBufferPointer(start: fieldBase.pointer, count: bits / 8)
            // Each thread walks the field from a different start, so threads
            // collide on every bit rather than following each other.
            let start = (t * 977) % bits
            for k in 0..<bits {
                let bit = (start + k) % bits
                if !AtomicMemory.testAndSet(bit: bit, in: buffer, ordering: .barrier) {
                    AtomicMemory.increment(winsBox.pointer + bit, ordering: .relaxed)
                }
            }
        }
        let lost = (0..<bits).filter { wins[$0] == 0 }
        let doubled = (0..<bits).filter { wins[$0] > 1 }
        #expect(lost.isEmpty, "bits nobody won: \(lost.prefix(10))")
        #expect(doubled.isEmpty, "bits won twice: \(doubled.prefix(10))")
        #expect(field.allSatisfy { $0 == 0xFF })
    }
}
