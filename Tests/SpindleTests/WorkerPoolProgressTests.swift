import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A word that items set and spin on, through atomics.
private final class Flag: @unchecked Sendable {
    // @unchecked: the word is read and written only through atomics.
    private let word = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    init() { word.initialize(to: 0) }
    deinit { word.deallocate() }

    func set() { AtomicMemory.store(1, to: word, ordering: .releasing) }
    func add() { AtomicMemory.add(1, to: word, ordering: .relaxed) }
    var value: Int { AtomicMemory.load(from: word, ordering: .acquiring) }

    /// Spins (no Spindle wait, no system call) until the flag is set or 10 s
    /// pass: an item that keeps its worker busy the whole time, as a
    /// computing item does. Returns whether the flag was set.
    func spinUntilSet() -> Bool {
        let deadline = MonotonicClock.now.advanced(by: .seconds(10))
        while value == 0 {
            if MonotonicClock.now >= deadline { return false }
            spinLoopHint()
        }
        return true
    }
}

/// Writes `text` to file descriptor 2 (the exit test's observed stderr).
private func writeToStandardError(_ text: String) {
    var text = text
    text.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}

/// Work that is ready reaches a free worker: an item submitted by an item
/// that keeps computing (or that waits for it where Spindle cannot see) does
/// not wait for its submitter to return, and workers blocked outside
/// Spindle's waits do not starve the pool. Each case runs in a child process
/// (an exit test), where no other test's items occupy the pool's workers,
/// so "another worker is free" holds; every wait is bounded, so a broken
/// pool fails the test instead of hanging it. `scripts/test` runs them with
/// each event backend.
@Suite("Worker pool: ready work reaches a free worker")
struct WorkerPoolProgressTests {
    private func stderr(_ r: ExitTest.Result?) -> String {
        String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
    }

    /// The first shape: an item submits another to the same global
    /// queue and spins until it has started. With the submitted item held
    /// in the submitter's private next-unit slot, it never started.
    @Test func anItemSubmittedByAComputingItemStartsOnAnotherWorker() async {
        await #expect(processExitsWith: .success) {
            exit(checkAnItemSubmittedByAComputingItemStartsOnAnotherWorker())
        }
    }

    /// A chain of 10^5 short items (each submits the next, so the slot's
    /// wake-ups find nothing and back off), whose last item submits one
    /// more and computes until it has started: the fill the back-off left
    /// unannounced is found by the pool's monitor, and the item starts on
    /// the free worker.
    @Test func anItemAtTheEndOfALongChainStillStartsWhileItsSubmitterComputes() async {
        await #expect(processExitsWith: .success) {
            exit(checkAnItemAtTheEndOfALongChainStillStartsWhileItsSubmitterComputes())
        }
    }

    /// Three levels: each item submits the next and computes until its
    /// child has started. With one free worker per level missing, the chain
    /// needs every submission to be taken by another worker while its
    /// submitter spins; on a pool narrower than the chain the monitor's
    /// blocked-worker rule does not apply (spinning threads are running),
    /// so the depth is the pool's width.
    @Test func nestedSubmissionsFromComputingItemsEachStartElsewhere() async {
        await #expect(processExitsWith: .success) {
            exit(checkNestedSubmissionsFromComputingItemsEachStartElsewhere())
        }
    }

    /// An item that waits for its helper through a pipe (a wait Spindle does
    /// not see) completes: the helper, in the waiter's slot, is taken by the
    /// other worker, or (on a one-worker pool) by a worker the monitor
    /// starts for the blocked one.
    @Test func anItemWaitingForItsHelperThroughAPipeCompletes() async {
        await #expect(processExitsWith: .success) {
            exit(checkAnItemWaitingForItsHelperThroughAPipeCompletes())
        }
    }

    /// A `ClosureJob`'s closures run at once: two closures that each spin
    /// until the other has started both finish (they ran one after another
    /// when the second sat in the first's slot).
    @Test func aClosureJobsComputingClosuresRunConcurrently() async {
        await #expect(processExitsWith: .success) {
            exit(checkAClosureJobsComputingClosuresRunConcurrently())
        }
    }

    /// A job added by a running job starts while the adder still computes.
    @Test func aJobAddedByARunningJobStartsWhileItRuns() async {
        await #expect(processExitsWith: .success) {
            exit(checkAJobAddedByARunningJobStartsWhileItRuns())
        }
    }

    /// `async let` under the pool as task executor starts its child at
    /// once, as on Swift's default executor: the parent spins until the
    /// child has run, without suspending.
    @Test func asyncLetOnThePoolStartsBeforeTheParentSuspends() async {
        await #expect(processExitsWith: .success) {
            exit(await checkAsyncLetOnThePoolStartsBeforeTheParentSuspends())
        }
    }

    /// The first child of a task group on the pool starts while the parent
    /// computes.
    @Test func aTaskGroupsFirstChildStartsBeforeTheParentSuspends() async {
        await #expect(processExitsWith: .success) {
            exit(await checkATaskGroupsFirstChildStartsBeforeTheParentSuspends())
        }
    }

    /// Every worker of the pool blocked in a plain `read()` (a wait the pool
    /// is not told of): another item and a queue timer's handler still run,
    /// on a worker the pool's monitor starts in their place; the blocked
    /// items finish once written to. The pool grows by what the monitor
    /// lent, within its bound.
    @Test func workersBlockedInReadDoNotStarveThePool() async {
        let r = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            exit(checkWorkersBlockedInReadDoNotStarveThePool())
        }
        print(stderr(r))
    }

    /// The monitor costs an idle pool nothing: after work, once every
    /// worker has parked, it takes no look in 300 ms (it looks every 10 ms
    /// while any worker runs).
    @Test func theMonitorSleepsWhileThePoolIsIdle() async {
        let r = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            exit(checkTheMonitorSleepsWhileThePoolIsIdle())
        }
        print(stderr(r))
    }
}

// MARK: The cases, each run in its own child process

private func checkAnItemSubmittedByAComputingItemStartsOnAnotherWorker() -> Int32 {
    let started = Flag()
    let result = Flag()
    let done = Semaphore(value: 0)
    WorkQueue.global().async {
        WorkQueue.global().async { started.set() }
        if started.spinUntilSet() { result.set() }
        _ = done.signal()
    }
    guard done.wait(timeout: .seconds(30)) == .completed else { return 2 }
    return result.value == 1 ? 0 : 1
}

private func checkNestedSubmissionsFromComputingItemsEachStartElsewhere() -> Int32 {
    let depth = WorkQueue.poolWidth
    let flags = (0...depth).map { _ in Flag() }
    let failures = Flag()
    let group = WorkGroup()
    @Sendable func level(_ n: Int) {
        flags[n].set()
        guard n < depth - 1 else { return }
        WorkQueue.global().async(group: group) { level(n + 1) }
        if !flags[n + 1].spinUntilSet() { failures.add() }
    }
    WorkQueue.global().async(group: group) { level(0) }
    guard group.wait(timeout: .seconds(30)) == .completed else { return 2 }
    return failures.value == 0 ? 0 : 1
}

private func checkAnItemWaitingForItsHelperThroughAPipeCompletes() -> Int32 {
    var fds: [Int32] = [0, 0]
    guard pipe(&fds) == 0 else { return 3 }
    let (readEnd, writeEnd) = (fds[0], fds[1])
    let done = Semaphore(value: 0)
    let got = Flag()
    WorkQueue.global().async {
        WorkQueue.global().async {
            var byte: UInt8 = 7
            _ = write(writeEnd, &byte, 1)
        }
        var byte: UInt8 = 0
        if read(readEnd, &byte, 1) == 1 && byte == 7 { got.set() }
        _ = done.signal()
    }
    guard done.wait(timeout: .seconds(30)) == .completed else { return 2 }
    return got.value == 1 ? 0 : 1
}

private func checkAClosureJobsComputingClosuresRunConcurrently() -> Int32 {
    let first = Flag()
    let second = Flag()
    let met = Flag()
    let job = ClosureJob(name: "spinning pair") {
        first.set()
        if second.spinUntilSet() { met.add() }
    }
    job.addClosure {
        second.set()
        if first.spinUntilSet() { met.add() }
    }
    let queue = JobQueue(name: "closures")
    queue.add(job)
    job.waitUntilFinished()
    return met.value == 2 ? 0 : 1
}

private func checkAJobAddedByARunningJobStartsWhileItRuns() -> Int32 {
    let started = Flag()
    let result = Flag()
    let queue = JobQueue(name: "adder")
    let adder = ClosureJob(name: "adder") {
        _ = queue.add { started.set() }
        if started.spinUntilSet() { result.set() }
    }
    queue.add(adder)
    adder.waitUntilFinished()
    queue.waitUntilAllJobsAreFinished()
    return result.value == 1 ? 0 : 1
}

private func checkAsyncLetOnThePoolStartsBeforeTheParentSuspends() async -> Int32 {
    let started = Flag()
    let outcome = await Task(executorPreference: WorkQueue.global()) { () async -> Bool in
        async let child: Void = started.set()
        let ran = started.spinUntilSet()
        await child
        return ran
    }.value
    return outcome ? 0 : 1
}

private func checkATaskGroupsFirstChildStartsBeforeTheParentSuspends() async -> Int32 {
    let started = Flag()
    let outcome = await Task(executorPreference: WorkQueue.global()) { () async -> Bool in
        await withTaskGroup(of: Void.self) { group in
            group.addTask { started.set() }
            let ran = started.spinUntilSet()
            await group.waitForAll()
            return ran
        }
    }.value
    return outcome ? 0 : 1
}

private func checkWorkersBlockedInReadDoNotStarveThePool() -> Int32 {
    let width = WorkQueue.poolWidth
    var pipes: [(Int32, Int32)] = []
    for _ in 0..<width {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { return 3 }
        pipes.append((fds[0], fds[1]))
    }
    let blocked = WorkGroup()
    let inRead = Flag()
    for (readEnd, _) in pipes {
        WorkQueue.global().async(group: blocked) {
            inRead.add()
            var byte: UInt8 = 0
            _ = read(readEnd, &byte, 1)
        }
    }
    // Every worker is in its read before the probes are queued.
    let deadline = MonotonicClock.now.advanced(by: .seconds(10))
    while inRead.value < width && MonotonicClock.now < deadline {
        NativeThread.sleep(for: .milliseconds(1))
    }
    let itemRan = Semaphore(value: 0)
    WorkQueue.global().async { _ = itemRan.signal() }
    let queue = WorkQueue(label: "starved.timer")
    let timer = EventSource.timer(interval: .milliseconds(5), on: .queue(queue))
    let fired = Semaphore(value: 0)
    timer.setEventHandler { _ in _ = fired.signal() }
    timer.activate()
    let itemOK = itemRan.wait(timeout: .seconds(10)) == .completed
    let timerOK = fired.wait(timeout: .seconds(10)) == .completed
    timer.cancel()
    let threads = WorkQueue.workerThreadCount(for: .default)
    for (_, writeEnd) in pipes {
        var byte: UInt8 = 1
        _ = write(writeEnd, &byte, 1)
    }
    let released = blocked.wait(timeout: .seconds(10)) == .completed
    writeToStandardError("STARVE: item \(itemOK), timer \(timerOK), blocked released \(released), threads \(threads) (width \(width))\n")
    return itemOK && timerOK && released && threads <= width + 1024 ? 0 : 1
}

private func checkTheMonitorSleepsWhileThePoolIsIdle() -> Int32 {
    let group = WorkGroup()
    for _ in 0..<10_000 { WorkQueue.global().async(group: group) {} }
    guard group.wait(timeout: .seconds(30)) == .completed else { return 2 }
    // A look sees every worker parked and disarms (one period), after the
    // last searcher's spin; on a loaded machine (or under ThreadSanitizer)
    // the last worker may park late, so the idle window is looked for in
    // consecutive 300 ms windows, up to 10 s: the monitor must stop looking,
    // not merely look less.
    var windows = 0
    var looks: [Int] = []
    let give = MonotonicClock.now.advanced(by: .seconds(10))
    while MonotonicClock.now < give {
        let before = WorkQueue.poolMonitorLooks
        NativeThread.sleep(for: .milliseconds(300))
        let after = WorkQueue.poolMonitorLooks
        windows += 1
        looks.append(after - before)
        if after == before && after > 0 {
            writeToStandardError("MONITOR: 0 looks in 300 ms idle after \(windows) window(s) (looks per window: \(looks); \(after) in all)\n")
            return 0
        }
    }
    writeToStandardError("MONITOR: never idle for 300 ms in 10 s (looks per window: \(looks))\n")
    return 1
}

private func checkAnItemAtTheEndOfALongChainStillStartsWhileItsSubmitterComputes() -> Int32 {
    let started = Flag()
    let result = Flag()
    let done = Semaphore(value: 0)
    @Sendable func link(_ left: Int) {
        if left > 0 {
            WorkQueue.global().async { link(left - 1) }
            return
        }
        WorkQueue.global().async { started.set() }
        if started.spinUntilSet() { result.set() }
        _ = done.signal()
    }
    WorkQueue.global().async { link(100_000) }
    guard done.wait(timeout: .seconds(30)) == .completed else { return 2 }
    return result.value == 1 ? 0 : 1
}
