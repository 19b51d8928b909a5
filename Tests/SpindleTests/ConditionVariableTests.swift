import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Plain state that a test's lock protects; deliberately not atomic.
private final class Shared: @unchecked Sendable {
    // @unchecked: every access happens holding the lock under test.
    var readyToGo = false
    var count = 0
    var done = 0
    var timeouts = 0
}

@Suite("ConditionVariable")
struct ConditionVariableTests {
    /// The guide's Listings 4-5 and 4-6: a thread waits while the predicate
    /// is false; the signalling thread sets it and signals inside the mutex.
    @Test func waitsUntilThePredicateIsSetAndSignalled() {
        let mutex = Lock()
        let condition = ConditionVariable()
        let shared = Shared()
        let rounds = 1_000
        let join = startThread {
            for _ in 0..<rounds {
                mutex.lock()
                while !shared.readyToGo { condition.wait(releasing: mutex) }
                shared.readyToGo = false
                shared.done += 1
                mutex.unlock()
            }
        }
        var delivered = 0
        while delivered < rounds {
            mutex.lock()
            if !shared.readyToGo {
                shared.readyToGo = true
                delivered += 1
                condition.signal()
            }
            mutex.unlock()
        }
        join()
        #expect(shared.done == rounds)
        #expect(mutex.wordValue == 0, "the lock word is idle again")
    }

    /// One lock, two variables: the bounded buffer that `Condition` cannot
    /// express. Signals only, never a broadcast.
    @Test func boundedBufferWithTwoVariablesOnOneLock() {
        let mutex = Lock()
        let notEmpty = ConditionVariable()
        let notFull = ConditionVariable()
        let shared = Shared()  // count: items in the buffer; done: items consumed
        let capacity = 4
        let items = 20_000
        let consumers = 3
        let join = startThread {
            runThreads(consumers) { _ in
                for _ in 0..<(items / consumers) {
                    mutex.lock()
                    while shared.count == 0 { notEmpty.wait(releasing: mutex) }
                    shared.count -= 1
                    shared.done += 1
                    notFull.signal()
                    mutex.unlock()
                }
            }
        }
        for _ in 0..<(items / consumers * consumers) {
            mutex.lock()
            while shared.count == capacity { notFull.wait(releasing: mutex) }
            shared.count += 1
            notEmpty.signal()
            mutex.unlock()
        }
        join()
        #expect(shared.done == items / consumers * consumers)
        #expect(shared.count == 0)
        #expect(mutex.wordValue == 0)
    }

    /// Every waiter comes back from a broadcast (requeued onto the lock, one
    /// per unlock), and the lock word ends idle.
    @Test(arguments: [1, 2, 6])
    func broadcastWakesEveryWaiter(waiters: Int) {
        let mutex = Lock()
        let condition = ConditionVariable()
        let shared = Shared()
        let join = startThread {
            runThreads(waiters) { _ in
                mutex.lock()
                while !shared.readyToGo {
                    if condition.wait(releasing: mutex, timeout: .seconds(30)) == .timedOut { shared.timeouts += 1 }
                }
                shared.done += 1
                mutex.unlock()
            }
        }
        usleep(20_000)
        mutex.lock()
        shared.readyToGo = true
        condition.broadcast()
        mutex.unlock()
        join()
        #expect(shared.done == waiters)
        #expect(shared.timeouts == 0, "a waiter hit its 30 s deadline: broadcast lost it")
        #expect(mutex.wordValue == 0)
    }

    /// A signal issued while the lock is held moves the waiter onto the lock;
    /// if the signaller then keeps the lock a while, the waiter still returns
    /// once it is released.
    @Test func signalUnderTheLockWakesTheWaiterAtUnlock() {
        let mutex = Lock()
        let condition = ConditionVariable()
        let shared = Shared()
        let join = startThread {
            mutex.lock()
            while !shared.readyToGo {
                if condition.wait(releasing: mutex, timeout: .seconds(30)) == .timedOut { shared.timeouts += 1 }
            }
            shared.done += 1
            mutex.unlock()
        }
        usleep(20_000)
        mutex.lock()
        shared.readyToGo = true
        condition.signal()
        usleep(10_000)
        mutex.unlock()
        join()
        #expect(shared.done == 1)
        #expect(shared.timeouts == 0)
        #expect(mutex.wordValue == 0)
    }

    /// Only the lower bound is asserted.
    @Test func timeoutIsHonoured() {
        let mutex = Lock()
        let condition = ConditionVariable()
        mutex.lock()
        let start = MonotonicClock.now
        #expect(condition.wait(releasing: mutex, timeout: .milliseconds(20)) == .timedOut)
        #expect(start.duration(to: .now) >= .milliseconds(20))
        #expect(!mutex.tryLock(), "held again after the timeout")
        mutex.unlock()
        #expect(mutex.wordValue == 0)
    }

    @Test func deadlineInThePastReturnsAtOnceHoldingTheLock() {
        let mutex = Lock()
        let condition = ConditionVariable()
        mutex.lock()
        let start = MonotonicClock.now
        #expect(condition.wait(releasing: mutex, until: start.advanced(by: .seconds(-1))) == .timedOut)
        #expect(condition.wait(releasing: mutex, timeout: .zero) == .timedOut)
        #expect(start.duration(to: .now) < .seconds(1))
        #expect(!mutex.tryLock())
        mutex.unlock()
    }

    @Test func distantFutureWaitsUntilSignalled() {
        let mutex = Lock()
        let condition = ConditionVariable()
        let shared = Shared()
        let join = startThread {
            mutex.lock()
            while !shared.readyToGo {
                #expect(condition.wait(releasing: mutex, until: .distantFuture) == .completed)
            }
            mutex.unlock()
        }
        usleep(10_000)
        mutex.lock()
        shared.readyToGo = true
        condition.signal()
        mutex.unlock()
        join()
    }

    @Test func signalAndBroadcastBeforeAnyWaitDoNothing() {
        let condition = ConditionVariable()
        condition.signal()
        condition.broadcast()
        let mutex = Lock()
        mutex.lock()
        #expect(condition.wait(releasing: mutex, timeout: .milliseconds(5)) == .timedOut)
        mutex.unlock()
    }

    /// The lost-wake-up hunt, natively: 10^6 hand-offs between two threads.
    @Test func millionHandOffsBetweenTwoThreadsLoseNoWakeUp() {
        let mutex = Lock()
        let condition = ConditionVariable()
        let shared = Shared()  // count: the turn
        let handOffs = 1_000_000
        runThreads(2) { me in
            mutex.lock()
            for turn in stride(from: me, to: handOffs, by: 2) {
                while shared.count != turn {
                    if condition.wait(releasing: mutex, timeout: .seconds(30)) == .timedOut { shared.timeouts += 1 }
                }
                shared.count += 1
                condition.signal()
            }
            mutex.unlock()
        }
        #expect(shared.count == handOffs)
        #expect(shared.timeouts == 0, "a wait hit its 30 s deadline: a lost wake-up")
        #expect(mutex.wordValue == 0)
    }
}

@Suite("ConditionVariable misuse")
struct ConditionVariableMisuseTests {
    @Test func waitingWithTwoDifferentLocks() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let condition = ConditionVariable()
            let first = Lock()
            let second = Lock()
            first.lock()
            _ = blocking { condition.wait(releasing: first, timeout: .milliseconds(1)) }
            first.unlock()
            second.lock()
            _ = blocking { condition.wait(releasing: second, timeout: .milliseconds(1)) }
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("ConditionVariable.wait(releasing:): this variable is already paired with another Lock"))
    }

    @Test func waitingWithAnUnlockedLock() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            blocking { ConditionVariable().wait(releasing: Lock()) }
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("ConditionVariable.wait(releasing:): `lock` is not locked"))
    }
}
