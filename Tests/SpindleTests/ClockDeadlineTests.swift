import Spindle
import Testing
import TestSupport

/// Deadlines on Swift's clocks, and `withLock(timeout:)`, on every kind of lock.
@Suite("Clock deadlines")
struct ClockDeadlineTests {
    @Test func everyLockTakesSwiftClockDeadlines() {
        let locks: [any Locking] = [Lock(), RecursiveLock(), SpinLock(), ReadWriteLock(), Condition(), ConditionLock()]
        for lock in locks {
            #expect(lock.lock(before: ContinuousClock.now + .seconds(1)), "\(type(of: lock))")
            lock.unlock()
            #expect(lock.lock(before: SuspendingClock.now + .seconds(1)), "\(type(of: lock))")
            lock.unlock()
            #expect(lock.withLock(before: ContinuousClock.now + .seconds(1)) { 1 } == 1)
            #expect(lock.withLock(timeout: .seconds(1)) { 2 } == 2)
        }
    }

    @Test func implicitNowStillMeansTheMonotonicClock() {
        // The generic forms must not make `.now` ambiguous.
        let lock = Lock()
        #expect(lock.lock(before: .now))
        #expect(lock.withLock(before: .now) { true } == nil, "held by the caller: a past deadline only tries")
        lock.unlock()
    }

    @Test func deadlinesPassWhileAnotherThreadHolds() {
        let lock = Lock()
        let rw = ReadWriteLock()
        let value = LockedValue(0)
        let held = Latch()
        let release = Latch()
        let join = startThread {
            lock.lock()
            rw.writeLock()
            value.withLock { _ in
                held.countDown()
                release.wait()
            }
            rw.writeUnlock()
            lock.unlock()
        }
        held.wait()
        #expect(!lock.lock(before: ContinuousClock.now + .milliseconds(2)))
        #expect(!lock.lock(before: SuspendingClock.now - .seconds(1)))
        #expect(lock.withLock(timeout: .milliseconds(2)) { true } == nil)
        #expect(lock.withLock(timeout: .zero) { true } == nil)
        #expect(!rw.readLock(before: ContinuousClock.now + .milliseconds(2)))
        #expect(!rw.writeLock(before: SuspendingClock.now))
        #expect(value.withLock(before: ContinuousClock.now + .milliseconds(2)) { _ in true } == nil)
        release.countDown()
        join()
        #expect(lock.withLock(timeout: .seconds(30)) { true } == true)
        #expect(rw.readLock(before: ContinuousClock.now + .seconds(30)))
        rw.readUnlock()
        #expect(value.withLock(before: SuspendingClock.now + .seconds(30)) { _ in true } == true)
    }

    @Test func timeoutFormRethrowsWithTheErrorType() {
        struct Stop: Error { let code: Int }
        let lock = Lock()
        do throws(Stop) {
            _ = try lock.withLock(timeout: .seconds(1)) { () throws(Stop) -> Int in throw Stop(code: 3) }
        } catch {
            #expect(error.code == 3)
        }
        #expect(lock.tryLock(), "released after the throw")
        lock.unlock()
    }
}

/// The waits of the conditions and threads layers take deadlines on Swift's
/// clocks too, and time out no earlier than asked.
@Suite("Deadlines on any clock: conditions and threads")
struct ConditionAndThreadClockTests {
    @Test func conditionsTimeOutNoEarlier() {
        let start = MonotonicClock.now
        let condition = Condition()
        condition.lock()
        #expect(condition.wait(until: ContinuousClock.now + .milliseconds(10)) == .timedOut)
        condition.unlock()
        let variable = ConditionVariable()
        let lock = Lock()
        lock.lock()
        #expect(variable.wait(releasing: lock, until: SuspendingClock.now + .milliseconds(10)) == .timedOut)
        lock.unlock()
        #expect(Semaphore(value: 0).wait(until: ContinuousClock.now + .milliseconds(10)) == .timedOut)
        #expect(Semaphore(value: 1).wait(until: ContinuousClock.now) == .completed)
        let conditionLock = ConditionLock(condition: 1)
        #expect(!conditionLock.lock(whenCondition: 2, before: ContinuousClock.now + .milliseconds(10)))
        #expect(conditionLock.lock(whenCondition: 1, before: ContinuousClock.now + .milliseconds(10)))
        conditionLock.unlock()
        #expect(start.duration(to: .now) >= .milliseconds(40))
    }

    @Test func threadsSleepAndJoinOnAnyClock() throws {
        let start = MonotonicClock.now
        NativeThread.sleep(until: ContinuousClock.now + .milliseconds(10))
        #expect(start.duration(to: .now) >= .milliseconds(10))
        let gate = Semaphore(value: 0)
        let thread = try NativeThread.start { () -> Int in
            gate.wait()
            return 42
        }
        #expect(try thread.join(until: SuspendingClock.now + .milliseconds(5)) == nil)
        #expect(try thread.join(timeout: .zero) == nil)
        gate.signal()
        #expect(try thread.join(timeout: .seconds(30)) == 42)
    }
}
