import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// An actor whose jobs run on a serial work queue.
actor QueueBoundCounter {
    let queue: WorkQueue
    private(set) var count = 0
    private(set) var offQueue = 0
    nonisolated var unownedExecutor: UnownedSerialExecutor { queue.asUnownedSerialExecutor() }

    init(queue: WorkQueue) { self.queue = queue }

    func increment() {
        if !queue.isCurrent { offQueue += 1 }
        count += 1
    }
}

/// An actor whose jobs run on a run loop's thread.
actor LoopBoundCounter {
    let loop: ThreadLoop
    private(set) var count = 0
    private(set) var offLoop = 0
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    init(loop: ThreadLoop) { self.loop = loop }

    func increment() {
        if !loop.isCurrent { offLoop += 1 }
        count += 1
    }
}

private func stderrText(_ r: ExitTest.Result?) -> String {
    String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
}

/// `assumeIsolated` from a synchronous function (it is unavailable in
/// asynchronous contexts).
private func assumeOffQueue() {
    let counter = QueueBoundCounter(queue: WorkQueue(label: "actor.elsewhere"))
    counter.assumeIsolated { _ in }
}

@Suite("Executors")
struct ExecutorTests {
    @Test func actorOnASerialQueueRunsEveryJobOnTheQueue() async {
        let counter = QueueBoundCounter(queue: WorkQueue(label: "actor.queue"))
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask { for _ in 0..<1_000 { await counter.increment() } }
            }
        }
        #expect(await counter.count == 8_000)
        #expect(await counter.offQueue == 0)
    }

    @Test func assumeIsolatedWorksInsideTheQueuesItems() {
        let queue = WorkQueue(label: "actor.assume")
        let counter = QueueBoundCounter(queue: queue)
        let seen = queue.sync {
            counter.assumeIsolated { counter in
                counter.increment()
                return counter.count
            }
        }
        #expect(seen == 1)
    }

    @Test func assumeIsolatedOffTheQueueStopsWithAMessage() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            assumeOffQueue()
        }
        // The runtime asks `isIsolatingCurrentContext()` (false here) and
        // stops with its own message.
        #expect(stderrText(r).contains("Incorrect actor executor assumption"))
    }

    @Test func actorOnALoopThreadRunsEveryJobOnTheLoop() async throws {
        let thread = try await LoopThread.start()
        let counter = LoopBoundCounter(loop: thread.loop)
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<4 {
                group.addTask { for _ in 0..<500 { await counter.increment() } }
            }
        }
        #expect(await counter.count == 2_000)
        #expect(await counter.offLoop == 0)
        thread.stop()
        try await thread.join()
    }

    @Test func taskExecutorPreferenceRunsOnThePool() async {
        let onPool = await Task(executorPreference: WorkQueue.global()) {
            WorkQueue.global().isCurrent
        }.value
        #expect(onPool)
        let inGroup = await withTaskExecutorPreference(WorkQueue.global()) {
            await withTaskGroup(of: Bool.self) { group in
                for _ in 0..<100 { group.addTask { WorkQueue.global().isCurrent } }
                var all = true
                for await one in group { all = all && one }
                return all
            }
        }
        #expect(inGroup)
    }

    @Test func concurrentQueueCannotBeAnActorsExecutor() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = WorkQueue(label: "actor.concurrent", kind: .concurrent).asUnownedSerialExecutor()
        }
        #expect(stderrText(r).contains(
            "'actor.concurrent' is concurrent; only a serial queue can be an actor's executor"))
    }

    @Test func awaitingAGroupSuspendsUntilItIsEmptyOrTimesOut() async throws {
        let group = WorkGroup()
        #expect(try await group.wait(timeout: .zero) == .completed)
        group.enter()
        #expect(try await group.wait(timeout: .milliseconds(5)) == .timedOut)
        let sum = LockedValue(0)
        for i in 1...100 { WorkQueue.global().async(group: group) { sum.withLock { $0 += i } } }
        group.leave()
        try await group.wait()
        #expect(sum.withLock { $0 } == 5_050)
    }

    @Test func awaitingAWorkItemAndAJob() async throws {
        let queue = WorkQueue(label: "await.item")
        let ran = LockedValue(false)
        let item = WorkItem { ran.withLock { $0 = true } }
        queue.async(item)
        try await item.wait()
        #expect(ran.withLock { $0 })
        let jobs = JobQueue(name: "await.jobs")
        let job = jobs.add { ran.withLock { $0 = false } }
        try await job.waitUntilFinished()
        #expect(job.isFinished && !ran.withLock { $0 })
    }

    @Test func awaitingAJoinReturnsTheBodysValueAndError() async throws {
        struct Oops: Error {}
        let thread = try NativeThread.start { 41 + 1 }
        #expect(try await thread.join() == 42)
        let failing = try NativeThread.start { () throws -> Int in throw Oops() }
        await #expect(throws: Oops.self) { try await failing.join() }
    }

    @Test func performReturningRunsOnTheLoopAndReturnsItsValue() async throws {
        let thread = try await LoopThread.start()
        let loop = thread.loop
        #expect(try await loop.performReturning { loop.isCurrent ? 7 : 0 } == 7)
        struct Oops: Error {}
        await #expect(throws: Oops.self) { try await loop.performReturning { () throws -> Int in throw Oops() } }
        thread.stop()
        try await thread.thread.join()
    }

    @Test func awaitedSemaphoreHandsOffBetweenTasks() async throws {
        let ping = Semaphore(value: 0)
        let pong = Semaphore(value: 0)
        let rounds = 2_000
        let echo = Task {
            for _ in 0..<rounds {
                try await ping.wait()
                pong.signal()
            }
        }
        for _ in 0..<rounds {
            ping.signal()
            try await pong.wait()
        }
        try await echo.value
        #expect(ping.value == 0 && pong.value == 0)
    }

    @Test func awaitedSemaphoreBoundsHowManyTasksRunAtOnce() async {
        let permits = Semaphore(value: 3)
        let occupancy = Occupancy()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<200 {
                group.addTask {
                    try! await permits.wait()  // never cancelled
                    _ = occupancy.enter()
                    await Task.yield()
                    occupancy.leave()
                    permits.signal()
                }
            }
        }
        #expect(occupancy.peak <= 3)
        #expect(permits.value == 3)
    }

    @Test func awaitingAndBlockingWaitersShareOneSemaphore() async {
        let semaphore = Semaphore(value: 0)
        let served = LockedValue(0)
        let threads = (0..<2).map { _ in
            startThread {
                for _ in 0..<500 {
                    semaphore.wait()
                    served.withLock { $0 += 1 }
                }
            }
        }
        let tasks = Task {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<2 {
                    group.addTask {
                        for _ in 0..<500 {
                            try! await semaphore.wait()  // never cancelled
                            served.withLock { $0 += 1 }
                        }
                    }
                }
            }
        }
        for _ in 0..<2_000 { semaphore.signal() }
        await tasks.value
        for join in threads { join() }
        #expect(served.withLock { $0 } == 2_000)
        #expect(semaphore.value == 0)
    }

    // MARK: Cancellation of the async waits

    /// A task on Spindle's pool rather than the default executor, whose two
    /// threads here are shared with every test running in parallel: a
    /// synchronous test holds one for its whole run, and a check that
    /// needed the default executor took 35-49 s in full runs (8 ms alone)
    /// and missed its time limit in a CI run (then 10 s).
    private func onPool(_ body: @escaping @Sendable () async throws -> Void) -> Task<Void, any Error> {
        Task(executorPreference: WorkQueue.global(), operation: body)
    }

    /// Whether `task` ended in `CancellationError` within 30 s of being
    /// cancelled (a wait that ignored the cancellation would hang there).
    /// The watcher runs on the pool too, so the outcome is recorded however
    /// late this test's own task gets a thread to read it.
    private func endsInCancellation(_ task: Task<Void, any Error>) async -> Bool {
        task.cancel()
        let outcome = LockedValue<Bool?>(nil)
        let watcher = onPool {
            do {
                try await task.value
                outcome.withLock { $0 = false }
            } catch is CancellationError {
                outcome.withLock { $0 = true }
            } catch {
                outcome.withLock { $0 = false }
            }
        }
        let deadline = MonotonicClock.now.advanced(by: .seconds(30))
        while outcome.withLock({ $0 }) == nil && MonotonicClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(1))
        }
        watcher.cancel()
        return outcome.withLock { $0 } == true
    }

    /// A task waiting on an empty semaphore leaves the line when cancelled:
    /// the wait throws, the count is as before the wait, and the next
    /// signal goes to the next waiter rather than to the one that left.
    @Test func cancellingAnAwaitedSemaphoreWaitEndsItAndLeavesTheCountAlone() async throws {
        let semaphore = Semaphore(value: 0)
        let started = Semaphore(value: 0)
        let waiter = onPool {
            started.signal()
            try await semaphore.wait()
        }
        try await started.wait()
        // Give it time to suspend in line (a cancellation before that is
        // the other path, tested below).
        while semaphore.value == 0 { await Task.yield() }
        #expect(semaphore.value == -1)
        try? await Task.sleep(for: .milliseconds(20))
        #expect(await endsInCancellation(waiter))
        #expect(semaphore.value == 0)
        // The next waiter gets the next signal.
        let next = Task { try await semaphore.wait() }
        semaphore.signal()
        try await next.value
        #expect(semaphore.value == 0)
    }

    /// Already cancelled: a wait that would suspend throws at once; a
    /// resource available now is still taken.
    @Test func aCancelledTaskTakesAnAvailableResourceAndOtherwiseThrows() async throws {
        let semaphore = Semaphore(value: 1)
        let outcome = LockedValue<[String]>([])
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            do { try await semaphore.wait(); outcome.withLock { $0.append("took") } }
            catch { outcome.withLock { $0.append("threw") } }
            do { try await semaphore.wait(); outcome.withLock { $0.append("took") } }
            catch { outcome.withLock { $0.append("threw") } }
        }
        await task.value
        #expect(outcome.withLock { $0 } == ["took", "threw"])
        #expect(semaphore.value == 0)
    }

    /// Group, item, job and join waits end on cancellation; what they waited
    /// for goes on and completes later without harm.
    @Test func cancellingTheOtherAsyncWaitsEndsThem() async throws {
        let group = WorkGroup()
        group.enter()
        #expect(await endsInCancellation(onPool { try await group.wait() }))
        #expect(await endsInCancellation(onPool { _ = try await group.wait(timeout: .seconds(60)) }))
        group.leave()
        try await group.wait()

        let gate = Semaphore(value: 0)
        let queue = WorkQueue(label: "cancel.item")
        let item = WorkItem { withBlockingRegion { gate.wait() } }
        queue.async(item)
        #expect(await endsInCancellation(onPool { try await item.wait() }))

        let jobs = JobQueue(name: "cancel.jobs")
        let job = jobs.add { withBlockingRegion { gate.wait() } }
        #expect(await endsInCancellation(onPool { try await job.waitUntilFinished() }))

        let thread = try NativeThread.start { gate.wait() }
        #expect(await endsInCancellation(onPool { _ = try await thread.join() }))

        for _ in 0..<3 { gate.signal() }
        try await item.wait()
        try await job.waitUntilFinished()
        // The cancelled join still joins the thread on a pool worker.
        let deadline = MonotonicClock.now.advanced(by: .seconds(10))
        while !thread.isFinished && MonotonicClock.now < deadline { try await Task.sleep(for: .milliseconds(1)) }
        #expect(thread.isFinished)
    }

    /// The cause of this suite's one logged failure (2026-11-26, CI): the
    /// cancelled waits and the watcher then ran on the default executor,
    /// whose threads (one per CPU) the synchronous tests running beside it
    /// held, so an outcome could not be recorded within the limit of that
    /// day (10 s), although the waits were right. Their tasks now run on
    /// Spindle's pool (`onPool`). This proves the outcome no longer depends
    /// on the default executor: with every one of its threads held (checked:
    /// a task started after them does not run), cancelled group, item and
    /// job waits on the pool still end in `CancellationError`. In a child
    /// process, so that holding the default executor stalls no other test.
    @Test func cancelledWaitsEndWhileTheDefaultExecutorIsHeld() async {
        await #expect(processExitsWith: .success) {
            holdTheDefaultExecutorAndCancelWaits()
        }
    }
}

/// The body of `cancelledWaitsEndWhileTheDefaultExecutorIsHeld`, in the
/// child: exits 0 only if every cancelled wait ended in
/// `CancellationError` while no default-executor thread was free; 2 if the
/// default executor could not be held (the check would prove nothing), 3 if
/// a wait did not end so.
private func holdTheDefaultExecutorAndCancelWaits() {
    let release = Latch()
    // More holders than the default executor has threads: each one that
    // gets a thread keeps it until `release` opens.
    for _ in 0..<(4 * Topology.onlineCPUs.count + 4) {
        Task.detached { _ = release.wait(seconds: 120) }
    }
    let probe = Latch()
    Task.detached { probe.countDown() }
    if probe.wait(seconds: 1) {
        print("the default executor ran a task after its holders: it was not held")
        exit(2)
    }
    let group = WorkGroup()
    group.enter()
    let gate = Latch()
    let item = WorkItem { withBlockingRegion { _ = gate.wait(seconds: 120) } }
    WorkQueue(label: "held.item").async(item)
    let job = JobQueue(name: "held.jobs").add { withBlockingRegion { _ = gate.wait(seconds: 120) } }
    let waits: [@Sendable () async throws -> Void] = [
        { try await group.wait() },
        { _ = try await group.wait(timeout: .seconds(60)) },
        { try await item.wait() },
        { try await job.waitUntilFinished() },
    ]
    let ended = Latch(waits.count)
    let cancelled = LockedValue(0)
    for wait in waits {
        let task = Task(executorPreference: WorkQueue.global(), operation: wait)
        task.cancel()
        Task(executorPreference: WorkQueue.global()) {
            if case .failure(let error) = await task.result, error is CancellationError {
                cancelled.withLock { $0 += 1 }
            }
            ended.countDown()
        }
    }
    let allEnded = ended.wait(seconds: 30)
    let count = cancelled.withLock { $0 }
    gate.countDown()
    group.leave()
    release.countDown()
    if !allEnded || count != waits.count {
        print("\(count) of \(waits.count) waits ended in CancellationError (all ended: \(allEnded))")
        exit(3)
    }
    exit(0)
}
