import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A count that only the lock under test protects: plain, non-atomic
/// memory, so ThreadSanitizer reports any two accesses the lock does not
/// order.
private final class PlainCount: @unchecked Sendable {
    // @unchecked: every access holds the lock under test; that is the claim
    // the stress checks.
    var value = 0
}

@Suite("AsyncLock stress")
struct AsyncLockStressTests {
    /// 8 tasks × 10^4 acquisitions, half on Spindle's pool and half on the
    /// default executor, each adding one to a plain counter, through every
    /// way in (`lock()`, `tryLock()`, `lock(timeout:)`, `withLock`); one
    /// critical section in 16 suspends (`Task.yield()`) while it holds the
    /// lock, so the others line up and are handed the lock. The count is
    /// exact, and the lock ends idle with nobody in line.
    @Test func plainCounterUnderTheLockIsExact() async {
        let lock = AsyncLock()
        let count = PlainCount()
        let tasks = 8
        let perTask = stressSize(ci: 10_000, full: 200_000)
        await withTaskGroup(of: Void.self) { group in
            for t in 0..<tasks {
                let body: @Sendable () async -> Void = {
                    for i in 0..<perTask {
                        // Never cancelled: the waits cannot throw here.
                        switch (i + t) % 4 {
                        case 0:
                            if !lock.tryLock() { try! await lock.lock() }
                        case 1:
                            while try! await !lock.lock(timeout: .seconds(600)) {}
                        default:
                            try! await lock.lock()
                        }
                        count.value += 1
                        if i % 16 == 0 { await Task.yield() }
                        lock.unlock()
                        if i % 64 == 0 {
                            try! await lock.withLock {
                                count.value -= 1
                                await Task.yield()
                                count.value += 1
                            }
                        }
                    }
                }
                if t % 2 == 0 {
                    group.addTask(executorPreference: WorkQueue.global(), operation: body)
                } else {
                    group.addTask(operation: body)
                }
            }
        }
        let total = lock.withLockForTests { count.value }
        #expect(total == tasks * perTask)
        #expect(lock.isIdle)
        #expect(lock.waiterCount == 0)
        StressReport.record(operations: tasks * perTask, threads: tasks, checks: 3)
    }

    /// Tasks line up for a lock while a thread cancels them at random and
    /// the holders hand it on: each task either acquires (adds one, then
    /// unlocks) or throws holding nothing. Acquisitions plus cancellations
    /// equal the tasks, the plain count equals the acquisitions, and the
    /// lock ends idle (a hand-off lost to a cancelled task would leave it
    /// held forever, and the test would not end). 2,000 tasks; 400 under
    /// ThreadSanitizer.
    @Test(.timeLimit(.minutes(5)))
    func cancellationsRacingHandOffsLoseNothing() async {
        // CI's 400 (TSan); 10× at full size, within the 5-minute limit under TSan.
        let tasks = stressSize(ci: 400, full: 4_000)
        let lock = AsyncLock()
        let count = PlainCount()
        let acquired = LockedValue(0)
        let cancelled = LockedValue(0)
        // Held while the tasks line up, so that most of them wait.
        try! await lock.lock()
        var waiters: [Task<Void, Never>] = []
        for i in 0..<tasks {
            waiters.append(Task(executorPreference: i % 2 == 0 ? WorkQueue.global() : nil) {
                do {
                    try await lock.lock()
                } catch {
                    cancelled.withLock { $0 += 1 }
                    return
                }
                count.value += 1
                if i % 8 == 0 { await Task.yield() }
                acquired.withLock { $0 += 1 }
                lock.unlock()
            })
        }
        let handles = Unchecked(waiters)
        let canceller = startThread {
            var generator = XorShift(seed: 29)
            for _ in 0..<(tasks / 2) {
                handles.value[generator.next(tasks)].cancel()
            }
        }
        lock.unlock()
        canceller()
        for task in waiters { await task.value }
        #expect(acquired.withLock { $0 } + cancelled.withLock { $0 } == tasks)
        #expect(lock.withLockForTests { count.value } == acquired.withLock { $0 })
        #expect(lock.isIdle)
        StressReport.record(operations: tasks + tasks / 2, threads: tasks, checks: 3)
    }

    /// Tasks wait with deadlines of 0–300 µs (so the lock's deadline timers
    /// run while holders hand the lock on, and tasks join with deadlines
    /// earlier than the timer pending) and some are cancelled: each either
    /// acquires (adds one, unlocks), times out, or throws, holding nothing.
    /// The three add up to the tasks, the plain count equals the
    /// acquisitions, the lock ends idle with no deadline in its line, and
    /// its timers all run. 2,000 tasks; 400 under ThreadSanitizer.
    @Test(.timeLimit(.minutes(5)))
    func deadlinesRacingHandOffsAndCancellationsLoseNothing() async {
        // CI's 400 (TSan); 10× at full size, within the 5-minute limit under TSan.
        let tasks = stressSize(ci: 400, full: 4_000)
        let lock = AsyncLock()
        let count = PlainCount()
        let outcomes = LockedValue((acquired: 0, timedOut: 0, cancelled: 0))
        try! await lock.lock()
        var waiters: [Task<Void, Never>] = []
        var generator = XorShift(seed: 41)
        for i in 0..<tasks {
            let timeout = Duration.microseconds(generator.next(300))
            waiters.append(Task(executorPreference: i % 2 == 0 ? WorkQueue.global() : nil) {
                let got: Bool
                do {
                    got = try await lock.lock(timeout: timeout)
                } catch {
                    outcomes.withLock { $0.cancelled += 1 }
                    return
                }
                guard got else {
                    outcomes.withLock { $0.timedOut += 1 }
                    return
                }
                count.value += 1
                if i % 8 == 0 { await Task.yield() }
                outcomes.withLock { $0.acquired += 1 }
                lock.unlock()
            })
            if i % 16 == 0 { lock.unlock(); try! await lock.lock() }
        }
        let handles = Unchecked(waiters)
        let canceller = startThread {
            var generator = XorShift(seed: 43)
            for _ in 0..<(tasks / 4) { handles.value[generator.next(tasks)].cancel() }
        }
        lock.unlock()
        canceller()
        for task in waiters { await task.value }
        let (acquired, timedOut, cancelled) = outcomes.withLock { ($0.acquired, $0.timedOut, $0.cancelled) }
        #expect(acquired + timedOut + cancelled == tasks)
        #expect(lock.withLockForTests { count.value } == acquired)
        #expect(lock.isIdle)
        #expect(lock.deadlinesInLine == 0)
        // Every deadline has passed: each pending timer runs soon (a state
        // to wait for, bounded only against a hang).
        var polls = 0
        while lock.pendingDeadlineTimers > 0 && polls < 60_000 {
            try? await Task.sleep(for: .milliseconds(1))
            polls += 1
        }
        #expect(lock.pendingDeadlineTimers == 0)
        StressReport.record(operations: tasks + tasks / 4, threads: tasks, checks: 6)
    }
}

extension AsyncLock {
    /// Reads under the lock from a synchronous context, for the checks
    /// after a run (the lock is idle then, so it never waits).
    fileprivate func withLockForTests<T>(_ body: () -> T) -> T {
        precondition(tryLock(), "the lock should be idle after the run")
        defer { unlock() }
        return body()
    }
}
