import Spindle
import Testing
import TestSupport

/// An error a `withLock` closure throws, to check typed throws.
private struct Refused: Error, Equatable {
    let code: Int
}

/// A class that is not `Sendable`: only a `LockedValue` makes it safe to share.
private final class Tally {
    var entries: [Int] = []
}

@Suite("LockedValue")
struct LockedValueTests {
    @Test func holdsItsValue() {
        let value = LockedValue(41)
        value.withLock { $0 += 1 }
        #expect(value.withLock { $0 } == 42)
        #expect(value.lockWordValue == 0)
    }

    @Test func copiesShareOneValueAndLock() {
        let a = LockedValue([String]())
        let b = a
        b.withLock { $0.append("from b") }
        #expect(a.withLock { $0 } == ["from b"])
        #expect(a == b)
        #expect(a != LockedValue([String]()))
    }

    @Test func typedThrowsKeepTheErrorTypeAndReleaseTheLock() {
        let value = LockedValue(0)
        do throws(Refused) {
            try value.withLock { (n: inout Int) throws(Refused) in
                n = 7
                throw Refused(code: n)
            }
            Issue.record("withLock did not rethrow")
        } catch {
            // `error` is a `Refused`, not `any Error`.
            #expect(error.code == 7)
        }
        #expect(value.withLockIfAvailable { $0 } == 7, "a change before the throw stays, and the lock is free")
        #expect(value.lockWordValue == 0)
    }

    @Test func withLockIfAvailableRunsOnlyWhenFree() {
        let value = LockedValue(0)
        #expect(value.withLockIfAvailable { n -> Int in
            n += 1
            return n
        } == 1)
        // The calling thread holds it: not available, and no deadlock.
        let inner = value.withLock { _ in value.withLockIfAvailable { _ in true } }
        #expect(inner == nil)
    }

    @Test func deadlineFormsGiveUpWhileAnotherThreadHolds() {
        let value = LockedValue(0)
        let held = Latch()
        let release = Latch()
        let join = startThread {
            value.withLock { n in
                n += 1
                held.countDown()
                release.wait()
            }
        }
        held.wait()
        #expect(value.withLockIfAvailable { _ in () } == nil)
        #expect(value.withLock(before: MonotonicClock.now) { _ in () } == nil, "a deadline in the past")
        #expect(value.withLock(timeout: .milliseconds(5)) { _ in () } == nil)
        #expect(value.withLock(timeout: .zero) { _ in () } == nil)
        #expect(value.description == "LockedValue<Int>(locked)")
        release.countDown()
        join()
        #expect(value.withLock(timeout: .seconds(30)) { $0 } == 1)
        #expect(value.withLock(before: .distantFuture) { $0 } == 1)
        #expect(value.lockWordValue == 0)
    }

    @Test func aWaiterGetsTheValueWhenTheHolderReleases() {
        let value = LockedValue([Int]())
        let held = Latch()
        let release = Latch()
        let holder = startThread {
            value.withLock { list in
                held.countDown()
                release.wait()
                list.append(1)
            }
        }
        held.wait()
        let waiter = startThread {
            // Waits (no deadline) until the holder is done.
            value.withLock { $0.append(2) }
        }
        release.countDown()
        holder()
        waiter()
        #expect(value.withLock { $0 } == [1, 2])
    }

    @Test func countsExactlyUnderContention() {
        let value = LockedValue(0)
        runThreads(4) { _ in
            for _ in 0..<10_000 { value.withLock { $0 += 1 } }
        }
        #expect(value.withLock { $0 } == 40_000)
        #expect(value.lockWordValue == 0)
    }

    @Test func guardsAValueThatIsNotSendable() {
        // `Tally` is not Sendable; the initial value is handed over (`sending`)
        // and only reached inside the lock, so the handle crosses threads.
        let tally = LockedValue(Tally())
        runThreads(2) { t in
            for i in 0..<100 { tally.withLock { $0.entries.append(t * 1000 + i) } }
        }
        #expect(tally.withLock { $0.entries.count } == 200)
    }

    @Test func describesItselfWithoutItsValue() {
        let value = LockedValue("secret")
        #expect(value.description == "LockedValue<String>(unlocked)")
        #expect(value.withLock { _ in value.description } == "LockedValue<String>(locked)")
    }
}
