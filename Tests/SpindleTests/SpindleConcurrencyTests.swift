import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The global-executor opt-in is process-wide and one-way, so every case
/// installs it in a child process (exit test) and checks there; a failed
/// check stops the child with a message the parent reads.

/// Counts jobs, and those that ran off Spindle's pool, under a Spindle lock.
private final class PoolTally: @unchecked Sendable {
    private let lock = Lock()
    private var ran = 0
    private var offPool: [String] = []

    /// Records one job running now: on the pool means inside an item of the
    /// global queue `expected` (or of any global queue when nil).
    func record(_ what: String, expected: WorkQueue? = nil) {
        let current = WorkQueue.current
        let onPool = expected.map { current == $0 } ?? WorkQueue.Priority.allCases.contains { current == WorkQueue.global($0) }
        lock.withLock {
            ran += 1
            if !onPool { offPool.append("\(what) ran on \(current.map { "\($0)" } ?? "no Spindle queue")") }
        }
    }

    var counts: (ran: Int, offPool: [String]) { lock.withLock { (ran, offPool) } }
}

private func check(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition { fatalError("check failed: " + message()) }
}

/// The names of this process's threads (/proc/self/task/*/comm).
private func threadNames() -> [String] {
    directoryEntries("/proc/self/task").compactMap { tid in
        procFileText("/proc/self/task/\(tid)/comm")?.filter { $0 != "\n" }
    }
}

private func stderrText(_ r: ExitTest.Result?) -> String {
    String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
}

@Suite("Global executor opt-in")
struct SpindleConcurrencyTests {
    @Test func everyKindOfGlobalJobRunsOnThePoolAtItsPriorityBand() async {
        await #expect(processExitsWith: .success) {
            check(!SpindleConcurrency.isInstalledAsGlobalExecutor, "installed before the call")
            check(WorkQueue.pendingDelayedSubmissions == 0, "delayed submissions pending before any sleep")
            SpindleConcurrency.installAsGlobalExecutor()
            check(SpindleConcurrency.isInstalledAsGlobalExecutor, "not installed after the call")
            let tally = PoolTally()

            for _ in 0..<100 {
                await Task { tally.record("Task {}") }.value
                await Task.detached { tally.record("Task.detached") }.value
            }
            async let first: Void = tally.record("async let")
            async let second: Void = tally.record("async let")
            _ = await (first, second)
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<1_000 { group.addTask { tally.record("group child") } }
            }
            // Spindle's timer heap times them: a sleep in progress is one of
            // its pending delayed submissions.
            let long = Task { try? await Task.sleep(for: .seconds(2)) }
            var sawItPending = false
            let giveUp = MonotonicClock.now.advanced(by: .seconds(20))
            while !sawItPending && MonotonicClock.now < giveUp {
                sawItPending = WorkQueue.pendingDelayedSubmissions > 0
                if !sawItPending { usleep(100) }
            }
            await long.value
            check(sawItPending, "a Task.sleep never waited in Spindle's timer heap: Dispatch timed it")
            await Task {
                try? await Task.sleep(nanoseconds: 1_000_000)
                tally.record("after Task.sleep(nanoseconds:)")
                try? await Task.sleep(for: .milliseconds(1))
                tally.record("after Task.sleep(for:)")
                try? await Task.sleep(until: .now + .milliseconds(1), clock: .suspending)
                tally.record("after a SuspendingClock sleep")
                try? await Task.sleep(until: .now + .milliseconds(1), clock: .continuous)
                tally.record("after a ContinuousClock sleep")
                try? await MonotonicClock().sleep(until: .now + .milliseconds(1))
                tally.record("after a MonotonicClock sleep")
            }.value
            check(!threadNames().contains("spindle.delay"), "a spindle.delay thread runs: the timer heap should time sleeps")
            let bands: [(TaskPriority, WorkQueue.Priority)] = [
                (.high, .high), (.medium, .default), (.low, .low), (.utility, .low), (.background, .background),
            ]
            for (taskPriority, band) in bands {
                await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                    Task.detached(priority: taskPriority) {
                        tally.record("Task(priority: \(taskPriority))", expected: WorkQueue.global(band))
                        try? await Task.sleep(for: .milliseconds(1))
                        tally.record("Task(priority: \(taskPriority)) after a sleep", expected: WorkQueue.global(band))
                        done.resume()
                    }
                }
            }
            let counter = PlainCounter()
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<10 { group.addTask { for _ in 0..<100 { await counter.increment(tally) } } }
            }
            let actorCount = await counter.count
            check(actorCount == 1_000, "actor count \(actorCount)")

            let (ran, offPool) = tally.counts
            check(ran == 200 + 2 + 1_000 + 5 + 2 * bands.count + 1_000, "ran \(ran) jobs")
            check(offPool.isEmpty, "off the pool: \(offPool.prefix(5))")
        }
    }

    @Test func aSecondInstallStopsWithAMessage() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            SpindleConcurrency.installAsGlobalExecutor()
            SpindleConcurrency.installAsGlobalExecutor()
        }
        #expect(stderrText(r).contains("SpindleConcurrency.installAsGlobalExecutor(): Spindle's pool is already Swift's global executor"))
    }

    /// Installed after tasks ran on Dispatch (at a quiet moment, as the
    /// documentation allows): what ran before stays where it ran, what is
    /// enqueued afterwards runs on the pool.
    @Test func aLateInstallMovesTheJobsEnqueuedAfterIt() async {
        await #expect(processExitsWith: .success) {
            let before = PoolTally()
            for _ in 0..<10 { await Task.detached { before.record("before the install") }.value }
            check(before.counts.ran == 10, "ran \(before.counts.ran) before the install")
            check(before.counts.offPool.count == 10, "a task ran on the pool before the install")

            SpindleConcurrency.installAsGlobalExecutor()
            let after = PoolTally()
            for _ in 0..<10 { await Task.detached { after.record("after the install") }.value }
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<100 { group.addTask { after.record("group child after the install") } }
            }
            let (ran, offPool) = after.counts
            check(ran == 110, "ran \(ran) after the install")
            check(offPool.isEmpty, "off the pool after the install: \(offPool.prefix(5))")
        }
    }
}

/// A default actor (no custom executor): its jobs go to the global executor.
private actor PlainCounter {
    private(set) var count = 0

    func increment(_ tally: PoolTally) {
        tally.record("default actor")
        count += 1
    }
}
