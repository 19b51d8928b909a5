import Spindle
import Testing
import TestSupport

/// A turn word and its futex, on its own allocation.
private final class Turn: @unchecked Sendable {
    // @unchecked: the word is only accessed through AtomicMemory and the kernel.
    let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
    init() { word.initialize(to: 0) }
    deinit { word.deallocate() }
}

@Suite("Futex stress")
struct FutexStressTests {
    /// Threads pass a turn around a ring, sleeping on the futex when it is not
    /// theirs: every hand-off must arrive (a lost wake-up hangs until the
    /// generous deadline and fails), and a plain counter written only by the
    /// turn holder must come out exact (the acquire/release pairing orders it).
    @Test(arguments: [2, 4])
    func turnPassingLosesNoWakeUp(threads: Int) {
        let rounds = stressSize(ci: 20_000, full: 400_000)
        let turn = Turn()
        let counter = UnsafeMutablePointer<Int>.allocate(capacity: 1)
        counter.initialize(to: 0)
        defer { counter.deallocate() }
        let counterBox = SharedPointer(counter)
        let timeouts = Turn()

        runThreads(threads) { t in
            let futex = Futex(turn.word)
            for round in 0..<rounds {
                let mine = UInt32(round * threads + t)
                while true {
                    let now = AtomicMemory.load(from: turn.word, ordering: .acquiring)
                    if now == mine { break }
                    if futex.wait(expecting: now, timeout: .seconds(30)) == .timedOut {
                        AtomicMemory.increment(timeouts.word, ordering: .relaxed)
                    }
                }
                counterBox.pointer.pointee += 1  // plain: ordered by the turn
                AtomicMemory.store(mine + 1, to: turn.word, ordering: .releasing)
                futex.wakeAll()
            }
        }
        #expect(counter.pointee == rounds * threads)
        #expect(AtomicMemory.load(from: timeouts.word) == 0, "a wait hit its 30 s deadline: a lost wake-up")
        // Each hand-off is one increment of the plain counter, checked by its exact total, and each wait by the timeout count.
        StressReport.record(operations: rounds * threads, threads: threads, checks: rounds * threads)
    }
}
