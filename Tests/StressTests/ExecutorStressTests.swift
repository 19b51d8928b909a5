import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// An actor on a Spindle executor that counts the hops it receives and
/// passes each one on to the next actor of a ring.
actor HopStation {
    let executor: any SerialExecutor
    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
    private(set) var received = 0
    private(set) var wrongPlace = 0
    private let isHome: @Sendable () -> Bool

    init(executor: any SerialExecutor, isHome: @escaping @Sendable () -> Bool) {
        self.executor = executor
        self.isHome = isHome
    }

    func hop(_ left: Int, through ring: [HopStation], at index: Int) async {
        received += 1
        if !isHome() { wrongPlace += 1 }
        guard left > 0 else { return }
        let next = ring[(index + 1) % ring.count]
        await next.hop(left - 1, through: ring, at: (index + 1) % ring.count)
    }
}

@Suite("Executor stress")
struct ExecutorStressTests {
    /// Hops between actors on two serial queues and two run-loop threads,
    /// from several tasks at once: every hop arrives exactly once, each on
    /// its actor's own queue or loop. 10^5 hops in CI (under ThreadSanitizer,
    /// which runs each hop ~10× slower); the 10^6 at full size.
    @Test func hopsBetweenActorsOnLoopsAndQueuesArriveExactlyOnce() async throws {
        let loops = try (0..<2).map { _ in try LoopThread.start() }
        let queues = (0..<2).map { WorkQueue(label: "hop.queue\($0)") }
        var ring: [HopStation] = []
        for i in 0..<2 {
            let queue = queues[i]
            ring.append(HopStation(executor: queue) { queue.isCurrent })
            let loop = loops[i].loop
            ring.append(HopStation(executor: loop) { loop.isCurrent })
        }
        let stations = ring
        let tasks = 8
        let total = stressSize(ci: 100_000, full: 1_000_000)
        let hopsPerTask = total / tasks
        await withTaskGroup(of: Void.self) { group in
            for t in 0..<tasks {
                group.addTask {
                    // Each call is one chain of up to 1,000 hops (deeper
                    // chains would nest too many suspended frames).
                    var left = hopsPerTask
                    while left > 0 {
                        let chain = min(left, 1_000)
                        await stations[t % stations.count].hop(chain - 1, through: stations, at: t % stations.count)
                        left -= chain
                    }
                }
            }
        }
        var received = 0
        for station in stations {
            received += await station.received
            #expect(await station.wrongPlace == 0)
        }
        #expect(received == tasks * hopsPerTask)
        for thread in loops {
            thread.stop()
            try await thread.thread.join()
        }
        // Every hop checked where it ran; each station's count, and the total.
        StressReport.record(operations: received, threads: tasks, checks: received + stations.count + 1)
    }

    /// Tasks suspended in `await wait()` and threads blocked in `wait()` on
    /// one semaphore, signalled from two threads: every signal is taken by
    /// exactly one waiter, none is lost, and the count ends at zero.
    @Test func awaitingAndBlockingWaitersTakeEverySignalOnce() async {
        let semaphore = Semaphore(value: 0)
        let perWaiter = stressSize(ci: 5_000, full: 100_000)
        let served = LockedValue(0)
        let blockers = (0..<2).map { _ in
            startThread {
                for _ in 0..<perWaiter {
                    semaphore.wait()
                    served.withLock { $0 += 1 }
                }
            }
        }
        let tasks = Task {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<4 {
                    group.addTask {
                        for _ in 0..<perWaiter {
                            try! await semaphore.wait()  // these tasks are never cancelled
                            served.withLock { $0 += 1 }
                        }
                    }
                }
            }
        }
        let signallers = (0..<2).map { _ in
            startThread { for _ in 0..<(3 * perWaiter) { semaphore.signal() } }
        }
        for join in signallers { join() }
        await tasks.value
        for join in blockers { join() }
        #expect(served.withLock { $0 } == 6 * perWaiter)
        #expect(semaphore.value == 0)
        // 2 blocking threads, 4 tasks, 2 signalling threads.
        StressReport.record(operations: 12 * perWaiter, threads: 8, checks: 2)
    }

    /// Swift's global executor on Spindle's pool (installed in a child
    /// process: the install is one-way): tasks of every priority band, each
    /// with children, sleeps and hops through a default actor, all at once.
    /// Every job runs once, on the pool, and the counts are exact; under
    /// ThreadSanitizer a report fails the child (TSAN_OPTIONS' exitcode).
    @Test func globalExecutorOnThePoolRunsEveryJobOnce() async {
        let r = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            SpindleConcurrency.installAsGlobalExecutor()
            let tasks = stressSize(ci: 200, full: 4_000)
            let priorities: [TaskPriority] = [.high, .medium, .low, .background]
            let tally = GlobalTally()
            await withTaskGroup(of: Void.self) { group in
                for t in 0..<tasks {
                    group.addTask(priority: priorities[t % priorities.count]) {
                        await withTaskGroup(of: Void.self) { children in
                            for _ in 0..<10 { children.addTask { tally.note() } }
                        }
                        if t % 10 == 0 { try? await Task.sleep(for: .microseconds(100)) }
                        await tally.actor.add(1)
                        tally.note()
                    }
                }
            }
            let (notes, offPool) = tally.counts
            let added = await tally.actor.total
            if notes != tasks * 11 || offPool != 0 || added != tasks {
                fatalError("notes \(notes) of \(tasks * 11), off the pool \(offPool), actor \(added) of \(tasks)")
            }
            recordGlobalExecutorRun(tasks: tasks)
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(!stderr.contains("ThreadSanitizer"), "\(stderr)")
    }

    /// Cancellations racing signals on one semaphore: tasks each wait once
    /// while a thread signals and another cancels tasks at random. Every
    /// task ends (nothing left waiting), each either took a resource or
    /// threw `CancellationError`, and no resource is lost or made: what the
    /// tasks took plus what is left equals the signals, and the count never
    /// keeps a withdrawn waiter. Group waits are cancelled the same way
    /// beside it. 2,000 tasks; 400 under ThreadSanitizer.
    @Test func cancellationsRacingSignalsLoseNothing() async throws {
        let tasks = stressSize(ci: 400, full: 8_000)
        let signals = tasks / 2
        let semaphore = Semaphore(value: 0)
        let group = WorkGroup()
        group.enter()
        let took = LockedValue(0)
        let cancelled = LockedValue(0)
        let groupCancelled = LockedValue(0)
        var waiters: [Task<Void, Never>] = []
        for i in 0..<tasks {
            waiters.append(Task {
                do {
                    if i % 4 == 3 {
                        _ = try await group.wait()
                        return
                    }
                    try await semaphore.wait()
                    took.withLock { $0 += 1 }
                } catch {
                    if i % 4 == 3 { groupCancelled.withLock { $0 += 1 } } else { cancelled.withLock { $0 += 1 } }
                }
            })
        }
        let handles = Unchecked(waiters)
        let signaller = startThread {
            for _ in 0..<signals {
                semaphore.signal()
            }
        }
        let canceller = startThread {
            var generator = XorShift(seed: 23)
            for _ in 0..<(tasks / 2) {
                handles.value[generator.next(tasks)].cancel()
            }
        }
        signaller()
        canceller()
        // Whoever is still waiting once the signals are all in is cancelled
        // now, so that every task ends.
        for task in waiters { task.cancel() }
        for task in waiters { await task.value }
        let semaphoreWaiters = tasks - tasks / 4
        #expect(took.withLock { $0 } + cancelled.withLock { $0 } == semaphoreWaiters)
        #expect(took.withLock { $0 } + semaphore.value == signals)
        #expect(semaphore.value >= 0)
        #expect(groupCancelled.withLock { $0 } == tasks / 4)
        StressReport.record(operations: tasks + signals + tasks / 2, threads: tasks, checks: 4)
        group.leave()
    }
}

/// Counts notes from jobs of the global executor, and those that ran
/// outside an item of one of Spindle's global queues.
/// Records `globalExecutorOnThePoolRunsEveryJobOnce` from its child process
/// (outside the exit test's closure, so the report names this file): every
/// job checked that it ran on the pool, plus the three totals.
private func recordGlobalExecutorRun(tasks: Int) {
    StressReport.record(
        operations: tasks * 11, threads: tasks, checks: tasks * 11 + 3,
        test: "globalExecutorOnThePoolRunsEveryJobOnce()")
}

private final class GlobalTally: @unchecked Sendable {
    // @unchecked: the counts are guarded by `lock`; `actor` is an actor.
    private let lock = Lock()
    private var notes = 0
    private var offPool = 0
    let actor = Summer()

    func note() {
        let current = WorkQueue.current
        let onPool = WorkQueue.Priority.allCases.contains { current == WorkQueue.global($0) }
        lock.withLock {
            notes += 1
            if !onPool { offPool += 1 }
        }
    }

    var counts: (notes: Int, offPool: Int) { lock.withLock { (notes, offPool) } }
}

/// A default actor: its jobs run on the global executor.
private actor Summer {
    private(set) var total = 0
    func add(_ n: Int) { total += n }
}
