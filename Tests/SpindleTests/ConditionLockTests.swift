import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The guide's condition values for its producer/consumer example.
private let noData = 0
private let hasData = 1

/// A queue of data that the condition lock protects; deliberately not atomic.
private final class DataQueue: @unchecked Sendable {
    // @unchecked: every access happens holding the condition lock.
    var items: [Int] = []
    var consumed: [Int] = []
}

/// Flags set by waiter threads, read by the test thread: atomic words.
private final class Flags: @unchecked Sendable {
    // @unchecked: the words are only accessed through AtomicMemory.
    let words = UnsafeMutablePointer<Int>.allocate(capacity: 4)
    init() { words.initialize(repeating: 0, count: 4) }
    deinit { words.deallocate() }
    func set(_ i: Int, _ value: Int) { AtomicMemory.store(value, to: words + i, ordering: .barrier) }
    func get(_ i: Int) -> Int { AtomicMemory.load(from: words + i, ordering: .barrier) }
}

@Suite("ConditionLock")
struct ConditionLockTests {
    /// The guide's producer/consumer: the producer takes the lock whatever
    /// its condition and leaves it HAS_DATA; consumers wait for HAS_DATA and
    /// leave it NO_DATA once the queue is empty. Every item is consumed
    /// exactly once.
    @Test(arguments: [1, 3])
    func guideProducerConsumer(consumers: Int) {
        let lock = ConditionLock(condition: noData)
        let queue = DataQueue()
        let items = 20_000
        let stop = -1
        let join = startThread {
            runThreads(consumers) { _ in
                while true {
                    lock.lock(whenCondition: hasData)
                    let item = queue.items.removeFirst()
                    if item != stop { queue.consumed.append(item) }
                    lock.unlock(withCondition: queue.items.isEmpty ? noData : hasData)
                    if item == stop { return }
                }
            }
        }
        for item in 0..<items {
            lock.lock()
            queue.items.append(item)
            lock.unlock(withCondition: hasData)
        }
        for _ in 0..<consumers {
            lock.lock()
            queue.items.append(stop)
            lock.unlock(withCondition: hasData)
        }
        join()
        #expect(queue.consumed.count == items)
        #expect(Set(queue.consumed).count == items)
        #expect(lock.condition == noData)
        #expect(lock.tryLock(), "free at the end")
        lock.unlock()
    }

    /// `unlock(withCondition: c)` hands the lock only to a thread waiting for
    /// `c`; a thread waiting for another value does not get it (nor wake).
    @Test func unlockWithConditionWakesOnlyMatchingWaiters() {
        let lock = ConditionLock(condition: 0)
        let flags = Flags()  // 1: thread waiting for 1 holds, 2: thread waiting for 2 holds
        lock.lock()
        let joinOne = startThread {
            lock.lock(whenCondition: 1)
            flags.set(1, 1)
            lock.unlock(withCondition: 3)
        }
        let joinTwo = startThread {
            lock.lock(whenCondition: 2)
            flags.set(2, 1)
            usleep(20_000)
            flags.set(2, 2)
            lock.unlock()  // keeps condition 2: nobody waits for it
        }
        usleep(20_000)  // both queued (correct either way)
        lock.unlock(withCondition: 2)
        joinTwo()
        #expect(flags.get(2) == 2)
        #expect(flags.get(1) == 0, "the waiter for 1 must not have the lock")
        #expect(lock.condition == 2)
        lock.lock()
        lock.unlock(withCondition: 1)
        joinOne()
        #expect(flags.get(1) == 1)
        #expect(lock.condition == 3)
    }

    /// The guide allows every combination: lock with unlock(withCondition:),
    /// lock(whenCondition:) with unlock, and the try and deadline forms.
    @Test func everyCombinationOfLockingAndUnlocking() {
        let lock = ConditionLock(condition: 7)
        #expect(lock.condition == 7)

        lock.lock()
        lock.unlock(withCondition: 8)
        #expect(lock.condition == 8)

        lock.lock(whenCondition: 8)
        lock.unlock()
        #expect(lock.condition == 8)

        #expect(!lock.tryLock(whenCondition: 7))
        #expect(lock.tryLock(whenCondition: 8))
        #expect(!lock.tryLock(), "held")
        #expect(!lock.tryLock(whenCondition: 8), "held")
        lock.unlock(withCondition: 9)

        #expect(lock.tryLock())
        lock.unlock()
        #expect(lock.lock(before: .distantFuture))
        lock.unlock()
        #expect(lock.lock(whenCondition: 9, before: .distantFuture))
        lock.unlock(withCondition: 10)
        #expect(lock.lock(whenCondition: 10, timeout: .seconds(1)))
        lock.unlock()
        #expect(lock.lock(timeout: .seconds(1)))
        lock.unlock()
    }

    /// A thread waiting in plain `lock()` takes the lock at the next unlock,
    /// whatever the condition.
    @Test func plainLockWaiterTakesAnyCondition() {
        let lock = ConditionLock(condition: 0)
        let flags = Flags()
        lock.lock()
        let join = startThread {
            lock.lock()
            flags.set(0, lock.condition)
            lock.unlock()
        }
        usleep(10_000)
        lock.unlock(withCondition: 42)
        join()
        #expect(flags.get(0) == 42)
    }

    /// Only the lower bound is asserted.
    @Test func timeoutIsHonoured() {
        let lock = ConditionLock(condition: 0)
        let start = MonotonicClock.now
        #expect(!lock.lock(whenCondition: 1, timeout: .milliseconds(20)))
        #expect(start.duration(to: .now) >= .milliseconds(20))
        // A held lock times out too, and a timed-out waiter leaves no trace.
        lock.lock()
        let join = startThread {
            let start = MonotonicClock.now
            #expect(!lock.lock(timeout: .milliseconds(20)))
            #expect(start.duration(to: .now) >= .milliseconds(20))
        }
        join()
        lock.unlock(withCondition: 1)
        #expect(lock.tryLock(whenCondition: 1))
        lock.unlock()
    }

    @Test func deadlineInThePastIsATry() {
        let lock = ConditionLock(condition: 0)
        let start = MonotonicClock.now
        let past = start.advanced(by: .seconds(-1))
        #expect(!lock.lock(whenCondition: 1, before: past))
        #expect(lock.lock(whenCondition: 0, before: past), "free and matching: taken")
        #expect(!lock.lock(before: past), "held")
        #expect(start.duration(to: .now) < .seconds(1))
        lock.unlock()
    }

    @Test func distantFutureWaitsForTheCondition() {
        let lock = ConditionLock(condition: 0)
        let join = startThread {
            #expect(lock.lock(whenCondition: 5, before: .distantFuture))
            lock.unlock(withCondition: 6)
        }
        usleep(10_000)
        lock.lock()
        lock.unlock(withCondition: 5)
        join()
        #expect(lock.condition == 6)
    }

    /// Hand-offs around a ring of threads, each waiting for its own value:
    /// targeted wake-ups carry the turn without a lost one.
    @Test func ringOfConditionsPassesEveryTurn() {
        let lock = ConditionLock(condition: 0)
        let threads = 4
        let rounds = 5_000
        let flags = Flags()  // 0: timeouts
        runThreads(threads) { me in
            for _ in 0..<rounds {
                if !lock.lock(whenCondition: me, timeout: .seconds(30)) {
                    flags.set(0, 1)
                    return
                }
                lock.unlock(withCondition: (me + 1) % threads)
            }
        }
        #expect(flags.get(0) == 0, "a wait hit its 30 s deadline: a lost hand-off")
        #expect(lock.condition == 0)
    }
}

@Suite("ConditionLock misuse")
struct ConditionLockMisuseTests {
    @Test func unlockingAnUnlockedLock() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            ConditionLock().unlock()
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("ConditionLock.unlock(): the lock is not locked"))
    }

    @Test func unlockingWithConditionAnUnlockedLock() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            ConditionLock(condition: 1).unlock(withCondition: 2)
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("ConditionLock.unlock(withCondition:): the lock is not locked"))
    }

    /// `tryLock` of a free lock succeeds even while another thread holds the
    /// internal guard (it used to wait for the guard, a fair mutex, for
    /// milliseconds). Bounded so that a regression fails instead of hanging.
    @Test func tryLockOfAFreeLockDoesNotWaitForTheGuard() {
        let anyCondition = ConditionLock(condition: 3)
        let thisCondition = ConditionLock(condition: 3)
        anyCondition.lockGuardForTesting()
        thisCondition.lockGuardForTesting()
        let results = Flags()
        let done = Latch()
        let guardsFree = Latch()
        let join = startThread {
            let tookAny = anyCondition.tryLock()
            let tookThis = thisCondition.tryLock(whenCondition: 3)
            results.set(0, tookAny ? 1 : 2)
            results.set(1, tookThis ? 1 : 2)
            done.countDown()
            // Unlocked by the thread that locked (another thread's unlock
            // is misuse, which ThreadSanitizer reports), once the guards
            // are free again.
            guardsFree.wait(seconds: 30)
            if tookAny { anyCondition.unlock() }
            if tookThis { thisCondition.unlock() }
        }
        let finished = done.wait(seconds: 10)
        anyCondition.unlockGuardForTesting()
        thisCondition.unlockGuardForTesting()
        guardsFree.countDown()
        join()
        #expect(finished, "tryLock waited for the guard")
        #expect(results.get(0) == 1)
        #expect(results.get(1) == 1)
        #expect(anyCondition.tryLock())
        anyCondition.unlock()
    }

    /// Threads hammering `lock()`/`unlock()` (with a pause outside the lock,
    /// so that it is free now and then; a saturated `ConditionLock` passes
    /// straight from holder to waiter and is never free) while another calls
    /// `tryLock()` until they are done: every try returns, some succeed, and
    /// exclusion holds.
    @Test func tryLockSucceedsWhileOthersHammer() {
        let lock = ConditionLock(condition: 0)
        let value = DataQueue()
        let flags = Flags()
        let hammerers = 8
        let rounds = 2_000
        runThreads(hammerers + 1) { index in
            if index == hammerers {
                var successes = 0
                var tries = 0
                while flags.get(1) < hammerers || successes == 0 {
                    tries += 1
                    if lock.tryLock() {
                        value.items.append(-1)
                        successes += 1
                        lock.unlock()
                    }
                    if tries % 64 == 0 { usleep(10) }
                }
                flags.set(0, successes)
            } else {
                for i in 0..<rounds {
                    lock.lock()
                    value.items.append(i)
                    lock.unlock()
                    usleep(20)
                }
                AtomicMemory.add(1, to: flags.words + 1, ordering: .barrier)
            }
        }
        #expect(flags.get(0) > 0)
        #expect(value.items.count == hammerers * rounds + flags.get(0))
    }

    /// A polling `tryLock()` wins while 8 threads hammer `lock()` /
    /// `unlock(withCondition:)` with nothing outside the lock: the lock is
    /// free between one holder's unlock and the next one's lock, as a
    /// `pthread_mutex_t` is (whose `trylock` wins about a quarter of such
    /// tries here). It never won when every unlock with a thread queued
    /// handed the lock straight to that thread (issue 38: 0 of 20,000; 0
    /// and 5 of these 2,000). Counts wins, not time: the minimum, 1%, is
    /// far below what a barging lock gets here alone (about 23%; it has to
    /// hold when other tests' threads share the two CPUs and preempt
    /// holders), and above what the handing-off lock got.
    ///
    /// Up to five rounds of 2,000 tries, passing at the first that reaches
    /// 1%: with the other tests' threads on two CPUs a round won 7 and 10
    /// times in two CI runs, and three rounds in a row won 18, 14 and 10
    /// once (2026-11-29, the whole unit suite on two vCPUs), while the
    /// handing-off lock never won more than 5 in a round, so it would still
    /// fail all five. Exclusion is checked in every round.
    @Test func tryLockWinsWhileOthersHammerLockAndUnlockWithCondition() {
        let lock = ConditionLock(condition: 0)
        let value = Guarded()
        let tries = 2_000
        var rounds: [Int] = []
        while rounds.count < 5 && (rounds.last ?? 0) < tries / 100 {
            let before = value.value
            let (won, hammered) = countTriesWonWhileHammered(
                hammerers: 8, tries: tries, spacingMicroseconds: 50,
                hammer: {
                    lock.lock()
                    value.value += 1
                    lock.unlock(withCondition: value.value & 3)
                },
                tryOnce: {
                    guard lock.tryLock() else { return false }
                    value.value += 1
                    lock.unlock()
                    return true
                })
            #expect(value.value - before == hammered + won, "exclusion held")
            rounds.append(won)
        }
        #expect(rounds.last! >= tries / 100, "tryLock won \(rounds) of \(tries) tries per round while others hammered")
        #expect(lock.tryLock(), "free at the end")
        lock.unlock()
    }
}
