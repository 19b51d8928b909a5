import Spindle
import Testing
import TestSupport

/// State whose invariant a torn critical section would break: `first` and
/// `second` are equal whenever the lock is free.
private struct Pair {
    var first = 0
    var second = 0
    var scratch = [Int](repeating: 0, count: 16)
}

@Suite("LockedValue stress")
struct LockedValueStressTests {
    /// Threads mix every entry point (`withLock`, `withLockIfAvailable`, the
    /// deadline and timeout forms, a thrown error) at random on one value,
    /// with work inside the lock between two halves of an update. Every
    /// closure checks the invariant on entry; the final count is exactly the
    /// number of closures that ran, and the lock word is idle again.
    /// ThreadSanitizer (scripts/test) checks that the value is never touched
    /// by two threads at once.
    @Test(arguments: [(threads: 2, iterations: 20_000), (threads: 8, iterations: 3_000)])
    func everyEntryPointKeepsTheValueWhole(shape: (threads: Int, iterations: Int)) {
        let shape = (threads: shape.threads, iterations: stressSize(ci: shape.iterations, full: 20 * shape.iterations))
        struct Interrupted: Error {}
        let value = LockedValue(Pair())
        let ran = LockedValue([Int](repeating: 0, count: shape.threads))
        let torn = LockedValue(0)
        runThreads(shape.threads) { t in
            var random = XorShift(seed: t + 1)
            var mine = 0
            for i in 0..<shape.iterations {
                let work = random.next(8)
                let update: (inout sending Pair) throws(Interrupted) -> sending Bool = { pair throws(Interrupted) in
                    let whole = pair.first == pair.second
                    pair.first += 1
                    for w in 0..<work { pair.scratch[w] &+= i }
                    if work == 7 && i % 5 == 0 {
                        pair.second += 1
                        throw Interrupted()
                    }
                    pair.second += 1
                    return whole
                }
                let whole: Bool?
                do throws(Interrupted) {
                    switch random.next(4) {
                    case 0: whole = try value.withLock(update)
                    case 1: whole = try value.withLockIfAvailable(update)
                    case 2: whole = try value.withLock(timeout: .microseconds(random.next(50)), update)
                    default: whole = try value.withLock(before: MonotonicClock.now.advanced(by: .microseconds(20)), update)
                    }
                } catch {
                    whole = true  // it ran, and threw after the update
                }
                if let whole {
                    mine += 1
                    if !whole { torn.withLock { $0 += 1 } }
                }
            }
            ran.withLock { $0[t] = mine }
        }
        let total = ran.withLock { $0.reduce(0, +) }
        let pair = value.withLock { $0 }
        #expect(torn.withLock { $0 } == 0, "a closure found the value half-updated")
        #expect(pair.first == total)
        #expect(pair.second == total)
        #expect(total >= shape.iterations, "the blocking form alone runs about a quarter of the iterations")
        #expect(value.lockWordValue == 0, "the lock word is idle after the run")
        // Every closure that ran checked the invariant on entry; plus the final totals.
        StressReport.record(operations: shape.threads * shape.iterations, threads: shape.threads, checks: total + 5)
    }
}
