import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Plain state that a test's condition (or lock) protects; deliberately not atomic.
private final class Protected: @unchecked Sendable {
    // @unchecked: every access happens holding the lock under test.
    var value = 0
    var other = 0
    var timeouts = 0
}

@Suite("Condition")
struct ConditionTests {
    /// The guide's Listings 4-3 and 4-4: a worker waits while there is no
    /// work; another thread adds work and signals, holding the lock.
    @Test func signalWakesAWaiterForEachPieceOfWork() {
        let condition = Condition()
        let state = Protected()  // value: timeToDoWork; other: work done
        let pieces = 1_000
        let join = startThread {
            for _ in 0..<pieces {
                condition.lock()
                while state.value <= 0 { condition.wait() }
                state.value -= 1
                state.other += 1
                condition.unlock()
            }
        }
        for _ in 0..<pieces {
            condition.lock()
            state.value += 1
            condition.signal()
            condition.unlock()
        }
        join()
        #expect(state.other == pieces)
        #expect(condition.lockWordValue == 0)
    }

    /// Regression guard for the requeueing broadcast: every waiter comes back,
    /// one per unlock, and the lock word ends idle (no `parked` bit left for
    /// a sleeper that never was woken).
    @Test(arguments: [1, 2, 6])
    func broadcastWakesEveryWaiter(waiters: Int) {
        let condition = Condition()
        let state = Protected()  // value: the gate (1 = open); other: threads through
        let join = startThread {
            runThreads(waiters) { _ in
                condition.lock()
                while state.value == 0 {
                    if condition.wait(timeout: .seconds(30)) == .timedOut { state.timeouts += 1 }
                }
                state.other += 1
                condition.unlock()
            }
        }
        // Let the waiters reach their sleep (correct either way).
        usleep(20_000)
        condition.lock()
        state.value = 1
        condition.broadcast()
        condition.unlock()
        join()
        #expect(state.other == waiters)
        #expect(state.timeouts == 0, "a waiter hit its 30 s deadline: broadcast lost it")
        #expect(condition.lockWordValue == 0)
    }

    /// Only the lower bound is asserted: tests never assert how late.
    @Test func timeoutIsHonoured() {
        let condition = Condition()
        condition.lock()
        let start = MonotonicClock.now
        #expect(condition.wait(timeout: .milliseconds(20)) == .timedOut)
        #expect(start.duration(to: .now) >= .milliseconds(20))
        #expect(condition.lockWordValue != 0, "the lock is held again after a timeout")
        condition.unlock()
        #expect(condition.lockWordValue == 0)
    }

    @Test func deadlineInThePastReturnsAtOnceHoldingTheLock() {
        let condition = Condition()
        condition.lock()
        let start = MonotonicClock.now
        #expect(condition.wait(until: start.advanced(by: .seconds(-1))) == .timedOut)
        #expect(condition.wait(until: MonotonicClock.Instant(nanoseconds: 0)) == .timedOut)
        #expect(condition.wait(timeout: .zero) == .timedOut)
        #expect(start.duration(to: .now) < .seconds(1))
        #expect(!condition.tryLock(), "still held by this thread")
        condition.unlock()
    }

    /// Foundation's `NSCondition.wait(until: .distantFuture)` traps on Linux;
    /// ours waits forever, i.e. until signalled.
    @Test func distantFutureWaitsUntilSignalled() {
        let condition = Condition()
        let state = Protected()
        let join = startThread {
            condition.lock()
            while state.value == 0 {
                #expect(condition.wait(until: .distantFuture) == .completed)
            }
            condition.unlock()
        }
        usleep(10_000)
        condition.lock()
        state.value = 1
        condition.signal()
        condition.unlock()
        join()
    }

    @Test func signalAndBroadcastWithNobodyWaitingDoNothing() {
        let condition = Condition()
        condition.signal()
        condition.broadcast()
        condition.lock()
        condition.signal()
        condition.broadcast()
        condition.unlock()
        #expect(condition.lockWordValue == 0)
        // A later waiter is not released by those earlier signals.
        condition.lock()
        #expect(condition.wait(timeout: .milliseconds(5)) == .timedOut)
        condition.unlock()
    }

    /// One condition, one producer, three consumers, a bounded buffer: each
    /// item is consumed exactly once and nobody hangs.
    @Test func boundedBufferWithOneConditionAndBroadcasts() {
        let condition = Condition()
        let state = Protected()  // value: items in the buffer; other: items consumed
        let capacity = 4
        let items = 20_000
        let consumers = 3
        let join = startThread {
            runThreads(consumers) { _ in
                while true {
                    condition.lock()
                    while state.value == 0 && state.other < items { condition.wait() }
                    if state.other >= items {
                        condition.unlock()
                        return
                    }
                    if state.value == capacity { condition.broadcast() }  // the producer may wait
                    state.value -= 1
                    state.other += 1
                    if state.other == items { condition.broadcast() }  // release the other consumers
                    condition.unlock()
                }
            }
        }
        for _ in 0..<items {
            condition.lock()
            while state.value == capacity { condition.wait() }
            if state.value == 0 { condition.broadcast() }  // consumers may wait
            state.value += 1
            condition.unlock()
        }
        join()
        #expect(state.other == items)
        #expect(state.value == 0)
        #expect(condition.lockWordValue == 0)
    }

    /// The lost-wake-up hunt, natively: 10^6 signal/wait hand-offs between
    /// two threads, each wait with a deadline that must never expire. (The
    /// ThreadSanitizer stress suite runs a smaller count.)
    @Test func millionHandOffsBetweenTwoThreadsLoseNoWakeUp() {
        let condition = Condition()
        let state = Protected()  // value: the turn counter
        let handOffs = 1_000_000
        runThreads(2) { me in
            condition.lock()
            for turn in stride(from: me, to: handOffs, by: 2) {
                while state.value != turn {
                    if condition.wait(timeout: .seconds(30)) == .timedOut { state.timeouts += 1 }
                }
                state.value += 1
                condition.signal()
            }
            condition.unlock()
        }
        #expect(state.value == handOffs)
        #expect(state.timeouts == 0, "a wait hit its 30 s deadline: a lost wake-up")
        #expect(condition.lockWordValue == 0)
    }

    @Test func copiesShareOneCondition() {
        let a = Condition()
        let b = a
        #expect(a == b)
        #expect(a != Condition())
        a.lock()
        #expect(!b.tryLock())
        b.unlock()
    }
}

@Suite("Condition misuse")
struct ConditionMisuseTests {
    @Test func waitingWithoutTheLock() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            blocking { Condition().wait() }
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("Condition.wait: the condition is not locked"))
    }

    @Test func unlockingAnUnlockedCondition() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            Condition().unlock()
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("unlock(): the lock is not locked"))
    }
}
