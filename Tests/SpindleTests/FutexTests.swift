import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A futex word on its own heap allocation, shared by the threads of a test.
private final class Word: @unchecked Sendable {
    // @unchecked: the word is only accessed through AtomicMemory and the kernel.
    let pointer = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
    var futex: Futex { Futex(pointer) }
    init(_ value: UInt32 = 0) { pointer.initialize(to: value) }
    deinit { pointer.deallocate() }
    func load() -> UInt32 { AtomicMemory.load(from: pointer, ordering: .acquiring) }
    func store(_ v: UInt32) { AtomicMemory.store(v, to: pointer, ordering: .releasing) }
}

@Suite("Futex")
struct FutexTests {
    @Test func deadlineInThePastTimesOutAtOnce() {
        let word = Word()
        let start = MonotonicClock.now
        #expect(word.futex.wait(expecting: 0, until: start.advanced(by: .seconds(-1))) == .timedOut)
        #expect(word.futex.wait(expecting: 0, until: MonotonicClock.Instant(nanoseconds: 0)) == .timedOut)
        #expect(word.futex.wait(expecting: 0, timeout: .zero) == .timedOut)
        // "At once": far below any sleep; generous so a loaded machine passes.
        #expect(start.duration(to: .now) < .seconds(1))
    }

    @Test func changedValueReturnsWithoutSleeping() {
        let word = Word(5)
        #expect(word.futex.wait(expecting: 4) == .valueChanged)
        #expect(word.futex.wait(expecting: 4, timeout: .seconds(60)) == .valueChanged)
    }

    /// Only the lower bound is asserted: tests never assert how late.
    @Test func timeoutIsHonoured() {
        let word = Word()
        let start = MonotonicClock.now
        #expect(word.futex.wait(expecting: 0, timeout: .milliseconds(20)) == .timedOut)
        #expect(start.duration(to: .now) >= .milliseconds(20))
    }

    @Test func wakeReleasesASleeper() {
        let word = Word()
        let join = startThread {
            while word.load() == 0 {
                _ = word.futex.wait(expecting: 0, until: .distantFuture)
            }
        }
        // Let the thread reach its sleep (correct either way: if it has not
        // slept yet, it sees 1 and never sleeps).
        usleep(10_000)
        word.store(1)
        word.futex.wake()
        join()
        #expect(word.load() == 1)
    }

    @Test func wakeAllWakesEveryWaiter() {
        let word = Word()
        let woken = Word()
        let waiters = 6
        let join = startThread {
            runThreads(waiters) { _ in
                while word.load() == 0 { _ = word.futex.wait(expecting: 0) }
                AtomicMemory.increment(woken.pointer, ordering: .barrier)
            }
        }
        usleep(20_000)
        word.store(1)
        word.futex.wakeAll()
        join()
        #expect(woken.load() == UInt32(waiters))
    }

    @Test func wakeWithNoWaitersWakesNobody() {
        let word = Word()
        #expect(word.futex.wake(3) == 0)
    }

    /// Requeue moves sleepers from one word to another without waking them:
    /// afterwards a wake on the first word finds nobody, and wakes on the
    /// second release them one by one.
    @Test func wakeAndRequeueMovesWaiters() {
        let condition = Word()
        let mutex = Word()
        let done = Word()
        let waiters = 4
        let join = startThread {
            runThreads(waiters) { _ in
                while condition.load() == 0 { _ = condition.futex.wait(expecting: 0) }
                AtomicMemory.increment(done.pointer, ordering: .barrier)
            }
        }
        // Move sleepers as they arrive until all of them sit on `mutex`.
        var moved = 0
        let deadline = MonotonicClock.now.advanced(by: .seconds(60))
        while moved < waiters && MonotonicClock.now < deadline {
            moved += condition.futex.wakeAndRequeue(wakeCount: 0, requeueCount: waiters, onto: mutex.futex, ifValue: 0) ?? 0
            usleep(1_000)
        }
        #expect(moved == waiters)
        #expect(condition.futex.wake(waiters) == 0, "requeued waiters no longer sleep on the first word")
        condition.store(1)
        var released = 0
        while AtomicMemory.load(from: done.pointer, ordering: .acquiring) < UInt32(waiters) && MonotonicClock.now < deadline {
            released += mutex.futex.wake(1)
            usleep(1_000)
        }
        join()
        #expect(released == waiters)
    }

    /// The requeue with a stale value does nothing and says so.
    @Test func wakeAndRequeueChecksTheValue() {
        let a = Word(1)
        let b = Word()
        #expect(a.futex.wakeAndRequeue(wakeCount: 1, requeueCount: 1, onto: b.futex, ifValue: 0) == nil)
    }

    /// A signal during the sleep does not end it early: EINTR is retried with
    /// the same absolute deadline.
    @Test func signalDuringWaitIsAbsorbed() {
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in }
        sigemptyset(&action.sa_mask)
        action.sa_flags = 0 // no SA_RESTART: the futex call returns EINTR
        var old = sigaction()
        sigaction(SIGUSR1, &action, &old)
        defer { sigaction(SIGUSR1, &old, nil) }

        let word = Word()
        let result = Word(99)
        let started = Word()
        let thread = UnsafeMutablePointer<UInt64>.allocate(capacity: 1)
        defer { thread.deallocate() }
        let threadBox = SharedPointer(thread)
        let join = startThread {
            AtomicMemory.store(UInt64(pthread_self()), to: threadBox.pointer, ordering: .releasing)
            started.store(1)
            let start = MonotonicClock.now
            let r = word.futex.wait(expecting: 0, timeout: .milliseconds(300))
            let slept = start.duration(to: .now)
            result.store(r == .timedOut && slept >= .milliseconds(300) ? 1 : 0)
        }
        while started.load() == 0 { usleep(1_000) }
        for _ in 0..<5 {
            usleep(20_000)
            pthread_kill(pthread_t(AtomicMemory.load(from: thread, ordering: .acquiring)), SIGUSR1)
        }
        join()
        #expect(result.load() == 1, "the wait ended before its deadline after a signal")
    }
}
