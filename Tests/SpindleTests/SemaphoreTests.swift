import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

@Suite("Semaphore")
struct SemaphoreTests {
    @Test func countsResources() {
        let semaphore = Semaphore(value: 2)
        #expect(semaphore.value == 2)
        semaphore.wait()
        #expect(semaphore.wait(timeout: .zero) == .completed)
        #expect(semaphore.value == 0)
        #expect(!semaphore.tryWait())
        #expect(semaphore.wait(timeout: .zero) == .timedOut)
        #expect(semaphore.value == 0, "a timed-out wait gives its place back")
        #expect(semaphore.signal() == false, "nobody was waiting")
        #expect(semaphore.tryWait())
        #expect(semaphore.signal() == false)
        #expect(semaphore.signal() == false)
        #expect(semaphore.value == 2)
    }

    @Test func signalReportsAWokenWaiter() {
        let semaphore = Semaphore(value: 0)
        let join = startThread { semaphore.wait() }
        // Wait until the thread is counted among the waiters.
        while semaphore.value >= 0 { usleep(1_000) }
        #expect(semaphore.signal() == true)
        join()
        #expect(semaphore.value == 0)
    }

    /// Only the lower bound is asserted.
    @Test func timeoutIsHonoured() {
        let semaphore = Semaphore(value: 0)
        let start = MonotonicClock.now
        #expect(semaphore.wait(timeout: .milliseconds(20)) == .timedOut)
        #expect(start.duration(to: .now) >= .milliseconds(20))
        #expect(semaphore.value == 0, "the timed-out waiter left the line")
    }

    @Test func deadlineInThePastReturnsAtOnce() {
        let semaphore = Semaphore(value: 0)
        let start = MonotonicClock.now
        #expect(semaphore.wait(until: start.advanced(by: .seconds(-1))) == .timedOut)
        #expect(semaphore.wait(until: MonotonicClock.Instant(nanoseconds: 0)) == .timedOut)
        #expect(start.duration(to: .now) < .seconds(1))
        #expect(semaphore.value == 0)
        semaphore.signal()
        #expect(semaphore.wait(until: start.advanced(by: .seconds(-1))) == .completed, "a resource is available")
    }

    @Test func distantFutureWaitsUntilSignalled() {
        let semaphore = Semaphore(value: 0)
        let join = startThread { #expect(semaphore.wait(until: .distantFuture) == .completed) }
        usleep(10_000)
        semaphore.signal()
        join()
    }

    /// The guide's example: a semaphore caps how many tasks hold a finite
    /// resource at once (there, file descriptors).
    @Test func limitsConcurrentUsersOfAResource() {
        let limit = 3
        let semaphore = Semaphore(value: limit)
        let users = LockedValue((now: 0, mostSeen: 0, uses: 0))
        runThreads(8) { _ in
            for _ in 0..<2_000 {
                semaphore.wait()
                users.withLock {
                    $0.now += 1
                    $0.mostSeen = max($0.mostSeen, $0.now)
                    $0.uses += 1
                }
                users.withLock { $0.now -= 1 }
                semaphore.signal()
            }
        }
        let counts = users.withLock { $0 }
        #expect(counts.mostSeen <= limit)
        #expect(counts.uses == 8 * 2_000)
        #expect(semaphore.value == limit)
    }

    /// Waiters that time out while others are woken: every signal still
    /// reaches a waiter, and the count ends where it started.
    @Test func timedOutWaitersDoNotSwallowSignals() {
        let semaphore = Semaphore(value: 0)
        let counts = LockedValue((successfulWaits: 0, threadsFinished: 0))
        let rounds = 2_000
        let join = startThread {
            runThreads(4) { i in
                for _ in 0..<rounds {
                    // Odd threads use tiny deadlines and give up often.
                    let timeout: Duration = i % 2 == 0 ? .seconds(30) : .microseconds(50)
                    if semaphore.wait(timeout: timeout) == .completed { counts.withLock { $0.successfulWaits += 1 } }
                }
                counts.withLock { $0.threadsFinished += 1 }
            }
        }
        var signalled = 0
        // Signal until every waiter has finished: each success used one signal.
        while counts.withLock({ $0.threadsFinished }) < 4 {
            semaphore.signal()
            signalled += 1
            if signalled % 64 == 0 { usleep(100) }
        }
        join()
        let successfulWaits = counts.withLock { $0.successfulWaits }
        #expect(successfulWaits >= 2 * rounds, "the patient threads got every wait")
        #expect(successfulWaits <= signalled)
        #expect(semaphore.value == signalled - successfulWaits, "unused signals remain as resources")
    }

    /// The lost-wake-up hunt for semaphores: 10^6 hand-offs between two
    /// threads through a pair of semaphores.
    @Test func millionHandOffsBetweenTwoThreadsLoseNoWakeUp() {
        let ping = Semaphore(value: 0)
        let pong = Semaphore(value: 0)
        let timeouts = LockedValue(0)
        let handOffs = 1_000_000
        runThreads(2) { me in
            let (mine, theirs) = me == 0 ? (ping, pong) : (pong, ping)
            if me == 0 { theirs.signal() }
            for _ in 0..<(handOffs / 2) {
                if mine.wait(timeout: .seconds(30)) == .timedOut { timeouts.withLock { $0 += 1 } }
                theirs.signal()
            }
        }
        #expect(timeouts.withLock { $0 } == 0, "a wait hit its 30 s deadline: a lost wake-up")
        // Thread 0 signalled once more than thread 1 waited for.
        #expect(ping.value + pong.value == 1)
    }

    @Test func copiesShareOneSemaphore() {
        let a = Semaphore(value: 1)
        let b = a
        #expect(a == b)
        #expect(a != Semaphore(value: 1))
        #expect(b.tryWait())
        #expect(!a.tryWait())
    }
}

@Suite("Semaphore misuse")
struct SemaphoreMisuseTests {
    @Test func negativeInitialValueIsRejected() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = Semaphore(value: -1)
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("Semaphore(value:): `value` is -1; a semaphore starts with zero or more resources"))
    }

    /// A signal at `Int.max` used to wrap the count to `Int.min` and report a
    /// woken waiter; it stops with a message instead.
    @Test func signalBeyondIntMaxStopsWithAMessage() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let semaphore = Semaphore(value: Int.max)
            _ = semaphore.signal()
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("Semaphore.signal(): the count overflowed"))
    }

    @Test func signalBelowIntMaxStillCounts() {
        let semaphore = Semaphore(value: Int.max - 1)
        #expect(!semaphore.signal())
        #expect(semaphore.value == Int.max)
        #expect(semaphore.tryWait())
        #expect(semaphore.value == Int.max - 1)
    }
}
