import Spindle
import Testing
import TestSupport

// The lost-wake-up hunt, under ThreadSanitizer (scripts/test). Every wait has
// a 30 s deadline that must never expire: a lost wake-up shows up as a
// timeout (and as a slow test), not as a hang. Plain fields, written only by
// the thread whose turn it is, check that each primitive orders memory (TSan
// reports a race otherwise).
//
// Counts (CI's, the default): 10^6 two-thread hand-offs for Condition here
// (about 20 s under ThreadSanitizer on the 2-core VM) and 10^5 for the other
// primitives, whose 10^6 runs natively in SpindleTests (ConditionVariableTests,
// SemaphoreTests); 10^5 hand-offs among 8 threads per primitive (10^4 for the
// broadcast ring, where each turn wakes all 7 other threads). The whole suite
// stays under a minute under ThreadSanitizer. At full size
// (SPINDLE_STRESS_SIZE=full, scripts/stress) every count is 10× that: the
// issue's 10^6 two-thread and 10^5 eight-thread hand-offs for every primitive,
// and ten times more for Condition.

/// Plain state guarded by the primitive under test; deliberately not atomic.
private final class Turns: @unchecked Sendable {
    // @unchecked: every access happens holding the lock (or the turn) under test.
    var turn = 0
    var timeouts = 0
    var sum = 0
}

/// A failure flag any thread may set.
private final class Failures: @unchecked Sendable {
    // @unchecked: the word is only accessed through AtomicMemory.
    let word = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    init() { word.initialize(to: 0) }
    deinit { word.deallocate() }
    func record() { AtomicMemory.increment(word, ordering: .barrier) }
    var count: Int { AtomicMemory.load(from: word, ordering: .barrier) }
}

private let patience: Duration = .seconds(30)

@Suite("Condition stress")
struct ConditionStressTests {
    // MARK: Two threads

    @Test func conditionHandOffsBetweenTwoThreads() {
        let condition = Condition()
        let turns = Turns()
        let handOffs = stressSize(ci: 1_000_000, full: 10_000_000)
        runThreads(2) { me in
            condition.lock()
            for turn in stride(from: me, to: handOffs, by: 2) {
                while turns.turn != turn {
                    if condition.wait(timeout: patience) == .timedOut { turns.timeouts += 1 }
                }
                turns.turn += 1
                condition.signal()
            }
            condition.unlock()
        }
        #expect(turns.turn == handOffs)
        #expect(turns.timeouts == 0, "a wait hit its deadline: a lost wake-up")
        #expect(condition.lockWordValue == 0)
        // Each hand-off's wait checked against its deadline, plus the final state.
        StressReport.record(operations: handOffs, threads: 2, checks: handOffs + 3)
    }

    @Test func conditionVariableHandOffsBetweenTwoThreads() {
        let mutex = Lock()
        let condition = ConditionVariable()
        let turns = Turns()
        let handOffs = stressSize(ci: 100_000, full: 1_000_000)
        runThreads(2) { me in
            mutex.lock()
            for turn in stride(from: me, to: handOffs, by: 2) {
                while turns.turn != turn {
                    if condition.wait(releasing: mutex, timeout: patience) == .timedOut { turns.timeouts += 1 }
                }
                turns.turn += 1
                condition.signal()
            }
            mutex.unlock()
        }
        #expect(turns.turn == handOffs)
        #expect(turns.timeouts == 0, "a wait hit its deadline: a lost wake-up")
        #expect(mutex.wordValue == 0)
        // Each hand-off's wait checked against its deadline, plus the final state.
        StressReport.record(operations: handOffs, threads: 2, checks: handOffs + 3)
    }

    /// The turn is handed over by the semaphores alone: `sum` is written by
    /// each thread in its turn, ordered only by signal/wait.
    @Test func semaphoreHandOffsBetweenTwoThreads() {
        let semaphores = [Semaphore(value: 1), Semaphore(value: 0)]
        let turns = Turns()
        let failures = Failures()
        let handOffs = stressSize(ci: 100_000, full: 1_000_000)
        runThreads(2) { me in
            for _ in 0..<(handOffs / 2) {
                if semaphores[me].wait(timeout: patience) == .timedOut {
                    failures.record()
                    return
                }
                turns.sum += 1
                semaphores[1 - me].signal()
            }
        }
        #expect(failures.count == 0, "a wait hit its deadline: a lost wake-up")
        #expect(turns.sum == handOffs)
        // Each hand-off's wait checked against its deadline, plus the final state.
        StressReport.record(operations: handOffs, threads: 2, checks: handOffs + 2)
    }

    @Test func conditionLockHandOffsBetweenTwoThreads() {
        let lock = ConditionLock(condition: 0)
        let turns = Turns()
        let failures = Failures()
        let handOffs = stressSize(ci: 100_000, full: 1_000_000)
        runThreads(2) { me in
            for _ in 0..<(handOffs / 2) {
                if !lock.lock(whenCondition: me, timeout: patience) {
                    failures.record()
                    return
                }
                turns.sum += 1
                lock.unlock(withCondition: 1 - me)
            }
        }
        #expect(failures.count == 0, "a wait hit its deadline: a lost hand-off")
        #expect(turns.sum == handOffs)
        // Each hand-off's wait checked against its deadline, plus the final state.
        StressReport.record(operations: handOffs, threads: 2, checks: handOffs + 2)
    }

    // MARK: Eight threads

    /// A ring of 8 threads, one variable per thread on one lock: each turn
    /// signals exactly the next thread's variable.
    @Test func conditionVariableRingOfEightThreads() {
        let threads = 8
        let mutex = Lock()
        let variables = (0..<threads).map { _ in ConditionVariable() }
        let turns = Turns()
        let handOffs = stressSize(ci: 100_000, full: 1_000_000)
        runThreads(threads) { me in
            mutex.lock()
            for turn in stride(from: me, to: handOffs, by: threads) {
                while turns.turn != turn {
                    if variables[me].wait(releasing: mutex, timeout: patience) == .timedOut { turns.timeouts += 1 }
                }
                turns.turn += 1
                variables[(me + 1) % threads].signal()
            }
            mutex.unlock()
        }
        #expect(turns.turn == handOffs)
        #expect(turns.timeouts == 0, "a wait hit its deadline: a lost wake-up")
        #expect(mutex.wordValue == 0)
        // Each hand-off's wait checked against its deadline, plus the final state.
        StressReport.record(operations: handOffs, threads: threads, checks: handOffs + 3)
    }

    /// A ring of 8 threads on one Condition: only the next thread can use a
    /// turn, so each turn broadcasts (all 7 waiters wake through the requeue
    /// chain, one per unlock).
    @Test func conditionBroadcastRingOfEightThreads() {
        let threads = 8
        let condition = Condition()
        let turns = Turns()
        let handOffs = stressSize(ci: 10_000, full: 100_000)
        runThreads(threads) { me in
            condition.lock()
            for turn in stride(from: me, to: handOffs, by: threads) {
                while turns.turn != turn {
                    if condition.wait(timeout: patience) == .timedOut { turns.timeouts += 1 }
                }
                turns.turn += 1
                condition.broadcast()
            }
            condition.unlock()
        }
        #expect(turns.turn == handOffs)
        #expect(turns.timeouts == 0, "a wait hit its deadline: broadcast lost a waiter")
        #expect(condition.lockWordValue == 0)
        // Each hand-off's wait checked against its deadline, plus the final state.
        StressReport.record(operations: handOffs, threads: threads, checks: handOffs + 3)
    }

    /// 8 threads, each waiting for its own condition value: every unlock
    /// hands the lock to exactly the next one.
    @Test func conditionLockRingOfEightThreads() {
        let threads = 8
        let lock = ConditionLock(condition: 0)
        let turns = Turns()
        let failures = Failures()
        let handOffs = stressSize(ci: 100_000, full: 1_000_000)
        runThreads(threads) { me in
            for _ in 0..<(handOffs / threads) {
                if !lock.lock(whenCondition: me, timeout: patience) {
                    failures.record()
                    return
                }
                turns.sum += 1
                lock.unlock(withCondition: (me + 1) % threads)
            }
        }
        #expect(failures.count == 0, "a wait hit its deadline: a lost hand-off")
        #expect(turns.sum == handOffs)
        #expect(lock.condition == 0)
        // Each hand-off's wait checked against its deadline, plus the final state.
        StressReport.record(operations: handOffs, threads: threads, checks: handOffs + 3)
    }

    /// 6 threads mixing every way in and out of one `ConditionLock`: plain
    /// `lock()` (which must never reach its 30 s deadline: a waiter the
    /// condition admits is woken, or handed the lock, by some unlock), waits
    /// for a condition with deadlines of a few microseconds (which race the
    /// unlocks that wake them), `tryLock` and `tryLock(whenCondition:)`
    /// (which barge), and unlocks that set random conditions. Every entry is
    /// counted in a plain field, so exclusion and ordering are checked (TSan
    /// reports a race otherwise); the lock ends free.
    @Test func conditionLockBargingTriesAndDeadlinesKeepExclusion() {
        let lock = ConditionLock(condition: 0)
        let turns = Turns()
        let entries = Failures()  // an atomic count of successful entries
        let failures = Failures()
        let rounds = stressSize(ci: 20_000, full: 200_000)
        runThreads(6) { me in
            var random = XorShift(seed: me + 1)
            for _ in 0..<rounds {
                let entered: Bool
                switch random.next(5) {
                case 0: entered = lock.lock(before: MonotonicClock.now.advanced(by: patience))
                    if !entered { failures.record() }
                case 1: entered = lock.lock(whenCondition: random.next(3), timeout: .microseconds(random.next(40)))
                case 2: entered = lock.tryLock()
                case 3: entered = lock.tryLock(whenCondition: random.next(3))
                default:
                    lock.lock()
                    entered = true
                }
                guard entered else { continue }
                turns.sum += 1
                entries.record()
                lock.unlock(withCondition: random.next(3))
            }
        }
        #expect(failures.count == 0, "a plain lock hit its 30 s deadline: a lost wake-up")
        #expect(turns.sum == entries.count)
        #expect(lock.tryLock(), "free at the end")
        lock.unlock()
        StressReport.record(operations: 6 * rounds, threads: 6, checks: entries.count + 3)
    }

    /// 8 threads, one semaphore each: the token goes round the ring.
    @Test func semaphoreRingOfEightThreads() {
        let threads = 8
        let semaphores = (0..<threads).map { $0 == 0 ? Semaphore(value: 1) : Semaphore(value: 0) }
        let turns = Turns()
        let failures = Failures()
        let handOffs = stressSize(ci: 100_000, full: 1_000_000)
        runThreads(threads) { me in
            for _ in 0..<(handOffs / threads) {
                if semaphores[me].wait(timeout: patience) == .timedOut {
                    failures.record()
                    return
                }
                turns.sum += 1
                semaphores[(me + 1) % threads].signal()
            }
        }
        #expect(failures.count == 0, "a wait hit its deadline: a lost wake-up")
        #expect(turns.sum == handOffs)
        #expect(semaphores[0].value == 1)
        // Each hand-off's wait checked against its deadline, plus the final state.
        StressReport.record(operations: handOffs, threads: threads, checks: handOffs + 3)
    }

    // MARK: Broadcast

    /// Rounds of a barrier: the coordinator opens a generation and
    /// broadcasts; every waiter must come through each time (the spirit of
    /// "unlock wakes every waiter"). Both condition types.
    @Test(arguments: [false, true])
    func broadcastWakesEveryWaiterEveryRound(useVariable: Bool) {
        let waiters = 7
        let rounds = stressSize(ci: 1_000, full: 20_000)
        let condition = Condition()
        let mutex = Lock()
        let variable = ConditionVariable()
        let lock: @Sendable () -> Void = { useVariable ? mutex.lock() : condition.lock() }
        let unlock: @Sendable () -> Void = { useVariable ? mutex.unlock() : condition.unlock() }
        let wait: @Sendable () -> Bool = {
            useVariable ? variable.wait(releasing: mutex, timeout: patience) == .completed : condition.wait(timeout: patience) == .completed
        }
        let broadcast: @Sendable () -> Void = { useVariable ? variable.broadcast() : condition.broadcast() }
        let state = Turns()  // turn: generation; sum: arrivals in this generation
        runThreads(waiters + 1) { me in
            lock()
            if me == waiters {
                for _ in 0..<rounds {
                    state.sum = 0
                    state.turn += 1
                    broadcast()
                    while state.sum < waiters {
                        if !wait() { state.timeouts += 1 }
                    }
                }
            } else {
                var seen = 0
                for _ in 0..<rounds {
                    while state.turn == seen {
                        if !wait() { state.timeouts += 1 }
                    }
                    seen = state.turn
                    state.sum += 1
                    if state.sum == waiters { broadcast() }
                }
            }
            unlock()
        }
        #expect(state.timeouts == 0, "a waiter hit its deadline: broadcast lost it")
        #expect(state.turn == rounds)
        #expect(condition.lockWordValue == 0)
        #expect(mutex.wordValue == 0)
        StressReport.record(operations: rounds * waiters, threads: waiters + 1, checks: rounds * waiters + 4)
    }

    // MARK: Timeouts racing wake-ups

    /// Waiters with tiny deadlines race signals: whatever mix of timeouts
    /// and wake-ups results, the lock ends idle and nothing hangs.
    @Test func shortDeadlinesRacingSignals() {
        let condition = Condition()
        let state = Turns()
        let rounds = stressSize(ci: 5_000, full: 100_000)
        runThreads(4) { me in
            for i in 0..<rounds {
                condition.lock()
                if me == 0 {
                    state.sum += 1
                    if i % 3 == 0 { condition.broadcast() } else { condition.signal() }
                } else {
                    _ = condition.wait(timeout: .microseconds(20 * (me + i % 5)))
                }
                condition.unlock()
            }
        }
        #expect(state.sum == rounds)
        #expect(condition.lockWordValue == 0)
        StressReport.record(operations: 4 * rounds, threads: 4, checks: 2)
    }

    /// Semaphore waiters with tiny deadlines racing signals: every signal is
    /// either taken by a wait or left in the count.
    @Test func semaphoreCountIsConservedUnderTimeouts() {
        let semaphore = Semaphore(value: 0)
        let taken = Failures()  // reused as an atomic counter
        let rounds = stressSize(ci: 5_000, full: 100_000)
        runThreads(4) { me in
            for i in 0..<rounds {
                if me == 0 {
                    semaphore.signal()
                } else if semaphore.wait(timeout: .microseconds(10 * (i % 7))) == .completed {
                    taken.record()
                }
            }
        }
        #expect(semaphore.value == rounds - taken.count)
        StressReport.record(operations: 4 * rounds, threads: 4, checks: 1)
    }
}
