import Spindle
import Testing
import TestSupport

@Suite("WallClock")
struct WallClockTests {
    @Test func instantsOrderBySecondsThenNanoseconds() {
        let a = WallClock.Instant(secondsSinceEpoch: 10, nanoseconds: 999_999_999)
        let b = WallClock.Instant(secondsSinceEpoch: 11, nanoseconds: 0)
        #expect(a < b)
        #expect(a.duration(to: b) == .nanoseconds(1))
        #expect(b.duration(to: a) == .nanoseconds(-1))
        #expect(WallClock.Instant(secondsSinceEpoch: 3, nanoseconds: 5).description == "3.000000005 s since 1970")
    }

    @Test func nowIsAfterThisCodeWasWritten() {
        // 2026-01-01T00:00:00Z; the wall clock may jump, never that far back.
        #expect(WallClock.now > WallClock.Instant(secondsSinceEpoch: 1_767_225_600))
    }

    @Test func advancedCarriesNanosecondsIntoSeconds() {
        let a = WallClock.Instant(secondsSinceEpoch: 10, nanoseconds: 999_999_999)
        #expect(a + .nanoseconds(1) == WallClock.Instant(secondsSinceEpoch: 11, nanoseconds: 0))
        #expect(a - .seconds(11) == WallClock.Instant(secondsSinceEpoch: -1, nanoseconds: 999_999_999))
        #expect((a + .milliseconds(1500)).duration(to: a) == .milliseconds(-1500))
    }

    // MARK: Wall-clock deadlines

    @Test func aWallClockDeadlineConvertsToTheSameDistanceOnTheMonotonicClock() {
        let before = MonotonicClock.now
        let deadline = (WallClock.now + .seconds(5)).monotonicInstant
        let after = MonotonicClock.now
        // Not early: at least 5 s after the first read, bar the two reads' skew.
        #expect(deadline >= before.advanced(by: .seconds(5) - .milliseconds(1)))
        #expect(deadline <= after.advanced(by: .seconds(5) + .milliseconds(1)))
        #expect((WallClock.now - .seconds(5)).monotonicInstant < MonotonicClock.now)
    }

    @Test func everyClockGenericDeadlineTakesAWallClockInstant() {
        let locks: [any Locking] = [Lock(), RecursiveLock(), SpinLock(), ReadWriteLock(), Condition(), ConditionLock()]
        for lock in locks {
            #expect(lock.lock(before: WallClock.now + .seconds(1)), "\(type(of: lock))")
            lock.unlock()
            #expect(lock.withLock(before: WallClock.now + .seconds(1)) { 1 } == 1)
        }
        let rw = ReadWriteLock()
        #expect(rw.readLock(before: WallClock.now + .seconds(1)))
        rw.readUnlock()
        #expect(rw.writeLock(before: WallClock.now + .seconds(1)))
        rw.writeUnlock()
        #expect(LockedValue(3).withLock(before: WallClock.now + .seconds(1)) { $0 } == 3)
    }

    @Test func conditionSemaphoreConditionLockAndSleepTakeAnyClock() {
        let condition = Condition()
        condition.lock()
        #expect(condition.wait(until: WallClock.now + .milliseconds(5)) == .timedOut)
        #expect(condition.wait(until: ContinuousClock.now - .seconds(1)) == .timedOut)
        #expect(condition.wait(until: .now) == .timedOut, "an untyped .now is still the monotonic clock")
        condition.unlock()
        let semaphore = Semaphore(value: 1)
        #expect(semaphore.wait(until: WallClock.now + .seconds(1)) == .completed)
        #expect(semaphore.wait(until: SuspendingClock.now + .milliseconds(5)) == .timedOut)
        let conditionLock = ConditionLock(condition: 1)
        #expect(!conditionLock.lock(whenCondition: 2, before: WallClock.now + .milliseconds(5)))
        #expect(conditionLock.lock(whenCondition: 1, before: WallClock.now + .seconds(1)))
        conditionLock.unlock()
        let start = MonotonicClock.now
        #expect(NativeThread.sleep(until: WallClock.now + .milliseconds(10)))
        #expect(start.duration(to: .now) >= .milliseconds(9), "not early")
        #expect(NativeThread.sleep(until: .now))
    }

    @Test func aWallClockDeadlineExpiresWhileAnotherThreadHolds() {
        let lock = Lock()
        let held = Latch()
        let release = Latch()
        let join = startThread {
            lock.lock()
            held.countDown()
            _ = release.wait()
            lock.unlock()
        }
        _ = held.wait()
        let start = MonotonicClock.now
        #expect(!lock.lock(before: WallClock.now + .milliseconds(20)))
        #expect(MonotonicClock.now >= start.advanced(by: .milliseconds(19)), "not early")
        #expect(!lock.lock(before: WallClock.now - .seconds(1)), "a past instant only tries")
        release.countDown()
        join()
        #expect(lock.lock(before: WallClock.now + .seconds(30)))
        lock.unlock()
    }

    @Test(arguments: availableBackends)
    func aRunLoopRunsUntilAWallClockInstant(_ kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let fired = UnsafeBox(false)
            loop.perform { fired.value = true }
            loop.run(until: WallClock.now + .milliseconds(20))
            #expect(fired.value)
            fired.value = false
            loop.perform { fired.value = true }
            loop.run(until: WallClock.now - .seconds(1))
            #expect(fired.value, "a past instant makes one pass")
        }
    }

    @Test func nanosecondsOutOfRangeStop() async {
        await #expect(processExitsWith: .failure) {
            _ = WallClock.Instant(secondsSinceEpoch: 0, nanoseconds: 1_000_000_000)
        }
    }
}
