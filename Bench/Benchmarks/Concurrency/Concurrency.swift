// Swift concurrency on Spindle's executors beside the executors a user would
// pick instead, each group's rows in the same run:
//
// 1. concurrency.actor hop: a caller task (on the default executor) awaits a
//    method of an actor whose executor runs on another thread, and is back
//    on its own executor when the await returns; one operation is one round
//    trip. Actors on a Spindle ThreadLoop (a LoopThread), on a serial
//    WorkQueue, on a swift-nio event loop (NIOPosix, one thread) [ref], and a
//    plain actor on the default executor (which the runtime may run on the
//    caller's own thread: no hop at all, for scale). The "callerOnPool" rows
//    run the caller on Spindle's pool instead (a task preferring
//    WorkQueue.global()), so that neither half of the round trip goes
//    through the default executor. The WorkQueue actor's callerOnPool row
//    is not a thread hop: the queue's drain is submitted from the caller's
//    own worker and runs there (the pool's next-unit slot), then the caller
//    resumes on it too; it shows what an actor on a queue costs a task on
//    the pool. The "globalExecutor" rows run the first two rows' plain
//    caller task after `SpindleConcurrency.installAsGlobalExecutor()`
//    (experimental), so the caller's half of the round trip is on
//    Spindle's pool too.
// 2. concurrency.task spawn+await: `Task(executorPreference:
//    WorkQueue.global()) {}` then `await .value`, beside `Task {}` on the
//    default executor [ref]; one operation is one task. Spindle's row drives
//    from a task on the pool, its "callerOnDefault" row from a task on the
//    default executor (a hop onto the pool and back per task).
// 3. concurrency.skynet: 10^6 leaves, fan-out 10, a recursive
//    `withTaskGroup` summing the leaves, inside
//    `withTaskExecutorPreference(WorkQueue.global())` beside the default
//    executor [ref]; one operation is the whole tree (1,111,110 child tasks).
//    The "globalExecutor" row runs the reference's tree after
//    `SpindleConcurrency.installAsGlobalExecutor()` (experimental): Swift's
//    global executor itself on Spindle's pool.
// 4. concurrency.handoff: two tasks on the default executor pass a token
//    back and forth, through AsyncStream [ref] and through a
//    withCheckedContinuation rendezvous; one operation is one hand-off (half
//    a round trip). The Spindle row passes it through `await
//    Semaphore.wait()` and `signal()`.
// 5. concurrency.async lock: 2 or 4 tasks on the default executor each take
//    a lock, add one to a shared counter and release it, over and over; one
//    operation is one acquisition and release (the counter is checked at
//    the end). Spindle's AsyncLock (`await lock()` / `unlock()`) beside an
//    actor-serialized counter [ref] (what a Swift user reaches for first),
//    `Semaphore(value: 1)` used as a binary semaphore (`await wait()` /
//    `signal()`), and Spindle.Lock's `withLock` (a thread lock: fine only
//    because this critical section has no `await` in it; an AsyncLock's
//    critical section may have one).
//
// A benchmark body is synchronous, so each iteration starts one driver task
// and the benchmark thread waits for it on a Spindle.Semaphore (30 s limit,
// a miss is reported on stderr): one extra hand-off per iteration of 1,000
// operations, the same for every row. Every row waits, so every group
// reports the process's CPU time per operation beside the wall clock.
// package-benchmark calls a body from its async runner, on a thread of
// Dispatch's default-QoS root queue (its name says so), which blocks for
// the iteration; the default executor's tasks run on threads of the
// user-initiated root queue. Every row, Spindle's included, runs beside
// that one blocked Dispatch thread.

import Benchmark
import BenchSupport
import Foundation
import NIOCore
import NIOPosix
import Spindle

// MARK: - Helpers

/// How long the benchmark thread waits for a driver task before it reports
/// a miss.
let patience: Duration = .seconds(30)

/// Reports a problem on stderr (a missed wait, a wrong result): the run
/// goes on, the message is in the log.
func report(_ message: String) {
    FileHandle.standardError.write(Data("Concurrency benchmarks: \(message)\n".utf8))
}

/// Runs `body` as a new task (on the default executor, or preferring
/// `executor`) and blocks the calling thread until it has finished.
func runTask(
    _ what: String, preferring executor: (any TaskExecutor)? = nil,
    _ body: sending @escaping @isolated(any) () async -> Void
) {
    let done = Spindle.Semaphore(value: 0)
    Task(executorPreference: executor) {
        await body()
        done.signal()
    }
    if done.wait(timeout: patience) == .timedOut { report("\(what): the driver task did not finish within \(patience)") }
}

// MARK: - 1. Actors on each executor

actor LoopActor {
    let loop: ThreadLoop
    var count = 0
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    init(loop: ThreadLoop) { self.loop = loop }
    func ping() -> Int {
        count &+= 1
        return count
    }
}

actor QueueActor {
    let queue: WorkQueue
    var count = 0
    nonisolated var unownedExecutor: UnownedSerialExecutor { queue.asUnownedSerialExecutor() }
    init(queue: WorkQueue) { self.queue = queue }
    func ping() -> Int {
        count &+= 1
        return count
    }
}

actor EventLoopActor {
    let executor: any SerialExecutor
    var count = 0
    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
    init(eventLoop: any EventLoop) { self.executor = eventLoop.executor }
    func ping() -> Int {
        count &+= 1
        return count
    }
}

actor PlainActor {
    var count = 0
    func ping() -> Int {
        count &+= 1
        return count
    }
}

// MARK: - 3. skynet

let skynetLeaves = 1_000_000
let skynetSum = skynetLeaves * (skynetLeaves - 1) / 2

/// The sum of `number ..< number + size`, one child task per tenth, down to
/// one task per leaf.
func skynet(_ number: Int, _ size: Int) async -> Int {
    if size == 1 { return number }
    let part = size / 10
    return await withTaskGroup(of: Int.self, returning: Int.self) { group in
        for i in 0..<10 {
            group.addTask { await skynet(number + i * part, part) }
        }
        var sum = 0
        for await value in group { sum += value }
        return sum
    }
}

/// `run` as one measured iteration of one whole tree that times itself: it
/// records its own time (`timePerOperation`), then restarts the harness's
/// window, so the harness times only the call's tail. The default
/// executor's tree takes about 2 s, and package-benchmark drops the
/// throughput of an iteration of 2 s or more (it rounds iterations per
/// second to an integer), and with it the row from the JMH export (as in
/// the Jobs benchmarks).
func selfTimed(_ run: @escaping () -> Void) -> (Benchmark) -> Void {
    { benchmark in
        let clock = ContinuousClock()
        let begin = clock.now
        run()
        benchmark.recordTimePerOperation(elapsed: clock.now - begin, operations: 1)
        benchmark.startMeasurement()
    }
}

// MARK: - 4. Hand-offs between two tasks

/// A one-slot rendezvous through `withCheckedContinuation`: `signal()`
/// resumes the waiting task, or leaves a permit for the next `wait()`.
final class ContinuationHandoff: @unchecked Sendable {
    // @unchecked: `permits` and `waiter` are only touched under `lock`.
    private let lock = NSLock()
    private var permits = 0
    private var waiter: CheckedContinuation<Void, Never>?

    func signal() {
        lock.lock()
        if let waiter {
            self.waiter = nil
            lock.unlock()
            waiter.resume()
        } else {
            permits += 1
            lock.unlock()
        }
    }

    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            lock.lock()
            if permits > 0 {
                permits -= 1
                lock.unlock()
                continuation.resume()
            } else {
                precondition(waiter == nil, "ContinuationHandoff: two waiters")
                waiter = continuation
                lock.unlock()
            }
        }
    }
}

// MARK: - 5. Async locks

/// The counter the async-lock rows guard with their lock; the lock is what
/// makes its unsynchronized access safe.
final class GuardedCounter: @unchecked Sendable {
    // @unchecked: `value` is only touched holding the row's lock.
    var value = 0
}

actor CountingActor {
    var value = 0
    func increment() { value &+= 1 }
}

/// Runs `tasks` child tasks (on the default executor), each calling `body`
/// `operations / tasks` times, and waits for them.
func contend(tasks: Int, operations: Int, _ body: @escaping @Sendable () async -> Void) async {
    await withTaskGroup(of: Void.self) { group in
        for _ in 0..<tasks {
            group.addTask {
                for _ in 0..<(operations / tasks) { await body() }
            }
        }
    }
}

/// One iteration of a contended-lock row: `tasks` tasks each call
/// `increment` `operations / tasks` times on one `GuardedCounter`, which
/// `increment` must add one to under the lock the row measures; a wrong
/// count is reported on stderr.
func countUnderLock(
    _ what: String, tasks: Int, operations: Int, _ increment: @escaping @Sendable (GuardedCounter) async -> Void
) {
    runTask(what) {
        let counter = GuardedCounter()
        await contend(tasks: tasks, operations: operations) { await increment(counter) }
        let expected = operations / tasks * tasks
        if counter.value != expected { report("\(what): count \(counter.value), expected \(expected)") }
    }
}

// MARK: - Registration

let benchmarks: @Sendable () -> Void = {
    // 1,000 operations per iteration, CPU time per operation beside it.
    let kiloOperations = RunSettings(
        scalingFactor: .kilo, maxDuration: .seconds(1), maxIterations: 1_000, warmupIterations: 3,
        reportedMetrics: [.cpuPerOperation])

    // MARK: 1. Cross-thread actor hop

    do {
        let group = "concurrency.actor hop and back"
        // Started once for the whole run and never stopped: the process
        // ends when the benchmarks do.
        let loopThread = try! LoopThread.start()
        let loopActor = LoopActor(loop: loopThread.loop)
        let queueActor = QueueActor(queue: WorkQueue(label: "bench.actor"))
        let eventLoops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let nioActor = EventLoopActor(eventLoop: eventLoops.next())
        let plainActor = PlainActor()
        sideBySide(
            group: group, settings: kiloOperations,
            implementations: [
                Implementation("Spindle.ThreadLoop", isReference: false) { benchmark in
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/Spindle.ThreadLoop") {
                        for _ in 0..<n { blackHole(await loopActor.ping()) }
                    }
                },
                Implementation("Spindle.WorkQueue", isReference: false) { benchmark in
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/Spindle.WorkQueue") {
                        for _ in 0..<n { blackHole(await queueActor.ping()) }
                    }
                },
                Implementation("Spindle.ThreadLoop callerOnPool", isReference: false) { benchmark in
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/Spindle.ThreadLoop callerOnPool", preferring: WorkQueue.global()) {
                        for _ in 0..<n { blackHole(await loopActor.ping()) }
                    }
                },
                Implementation("Spindle.WorkQueue callerOnPool", isReference: false) { benchmark in
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/Spindle.WorkQueue callerOnPool", preferring: WorkQueue.global()) {
                        for _ in 0..<n { blackHole(await queueActor.ping()) }
                    }
                },
                // The experimental opt-in: the caller is a plain task, as in
                // the first two rows, but Swift's global executor is
                // Spindle's pool (package-benchmark runs each row in a
                // process of its own, so the one-way install affects this
                // row only).
                Implementation("Spindle.ThreadLoop globalExecutor", isReference: false) { benchmark in
                    if !SpindleConcurrency.isInstalledAsGlobalExecutor {
                        SpindleConcurrency.installAsGlobalExecutor()
                    }
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/Spindle.ThreadLoop globalExecutor") {
                        for _ in 0..<n { blackHole(await loopActor.ping()) }
                    }
                },
                Implementation("Spindle.WorkQueue globalExecutor", isReference: false) { benchmark in
                    if !SpindleConcurrency.isInstalledAsGlobalExecutor {
                        SpindleConcurrency.installAsGlobalExecutor()
                    }
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/Spindle.WorkQueue globalExecutor") {
                        for _ in 0..<n { blackHole(await queueActor.ping()) }
                    }
                },
                .reference("NIO.EventLoop") { benchmark in
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/NIO.EventLoop") {
                        for _ in 0..<n { blackHole(await nioActor.ping()) }
                    }
                },
                .peer("default executor") { benchmark in
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/default executor") {
                        for _ in 0..<n { blackHole(await plainActor.ping()) }
                    }
                },
            ])
    }

    // MARK: 2. Task spawn + await

    do {
        let group = "concurrency.task spawn and await"
        sideBySide(
            group: group, settings: kiloOperations,
            implementations: [
                Implementation("Spindle", isReference: false) { benchmark in
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/Spindle", preferring: WorkQueue.global()) {
                        for _ in 0..<n {
                            await Task(executorPreference: WorkQueue.global()) { blackHole(0) }.value
                        }
                    }
                },
                Implementation("Spindle.callerOnDefault", isReference: false) { benchmark in
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/Spindle.callerOnDefault") {
                        for _ in 0..<n {
                            await Task(executorPreference: WorkQueue.global()) { blackHole(0) }.value
                        }
                    }
                },
                .reference("default executor") { benchmark in
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/default executor") {
                        for _ in 0..<n {
                            await Task { blackHole(0) }.value
                        }
                    }
                },
            ])
    }

    // MARK: 3. skynet with a task group

    do {
        // One iteration is one tree, timed by itself (`selfTimed`). The
        // default executor's tree takes about 2 s here: a 10 s budget with
        // one warm-up tree leaves it several measured trees.
        let group = "concurrency.skynet taskgroup 1000000 leaves fan-out 10"
        let settings = RunSettings(
            scalingFactor: .one, maxDuration: .seconds(10), maxIterations: 5, warmupIterations: 1,
            reportedMetrics: [.timePerOperation, .cpuPerOperation], operationsPerIteration: 1)
        sideBySide(
            group: group, settings: settings,
            implementations: [
                Implementation("Spindle", isReference: false, body: selfTimed {
                    runTask("\(group)/Spindle") {
                        let sum = await withTaskExecutorPreference(WorkQueue.global()) {
                            await skynet(0, skynetLeaves)
                        }
                        if sum != skynetSum { report("\(group)/Spindle: sum \(sum), expected \(skynetSum)") }
                    }
                }),
                // The experimental opt-in: the same tree as the reference,
                // with Swift's global executor moved onto Spindle's pool.
                // package-benchmark runs each benchmark in a process of its
                // own, so the one-way install affects this row only; it
                // happens in the first call (the warm-up), while the
                // harness's runner is blocked in this body.
                Implementation("Spindle.globalExecutor", isReference: false, body: selfTimed {
                    if !SpindleConcurrency.isInstalledAsGlobalExecutor {
                        SpindleConcurrency.installAsGlobalExecutor()
                    }
                    runTask("\(group)/Spindle.globalExecutor") {
                        let sum = await skynet(0, skynetLeaves)
                        if sum != skynetSum { report("\(group)/Spindle.globalExecutor: sum \(sum), expected \(skynetSum)") }
                    }
                }),
                .reference("default executor", body: selfTimed {
                    runTask("\(group)/default executor") {
                        let sum = await skynet(0, skynetLeaves)
                        if sum != skynetSum { report("\(group)/default executor: sum \(sum), expected \(skynetSum)") }
                    }
                }),
            ])
    }

    // MARK: 4. Hand-off between two tasks

    do {
        // 1,000 hand-offs per iteration: 500 round trips between a driver
        // task and a partner task, both on the default executor.
        let group = "concurrency.handoff between 2 tasks"
        sideBySide(
            group: group, settings: kiloOperations,
            implementations: [
                .reference("AsyncStream") { benchmark in
                    let roundTrips = benchmark.scaledIterations.count / 2
                    runTask("\(group)/AsyncStream") {
                        let (partnerInbox, toPartner) = AsyncStream.makeStream(of: Int.self)
                        let (driverInbox, toDriver) = AsyncStream.makeStream(of: Int.self)
                        let partner = Task {
                            for await token in partnerInbox { toDriver.yield(token) }
                            toDriver.finish()
                        }
                        var replies = driverInbox.makeAsyncIterator()
                        var received = 0
                        for i in 0..<roundTrips {
                            toPartner.yield(i)
                            if await replies.next() == i { received += 1 }
                        }
                        toPartner.finish()
                        await partner.value
                        if received != roundTrips {
                            report("\(group)/AsyncStream: \(received) replies, expected \(roundTrips)")
                        }
                    }
                },
                .peer("Spindle.Semaphore") { benchmark in
                    // `await wait()` suspends the task; `signal()` resumes it.
                    let roundTrips = benchmark.scaledIterations.count / 2
                    runTask("\(group)/Spindle.Semaphore") {
                        let toPartner = Spindle.Semaphore(value: 0)
                        let toDriver = Spindle.Semaphore(value: 0)
                        // Never cancelled: the waits cannot throw here.
                        let partner = Task {
                            for _ in 0..<roundTrips {
                                try! await toPartner.wait()
                                toDriver.signal()
                            }
                        }
                        for _ in 0..<roundTrips {
                            toPartner.signal()
                            try! await toDriver.wait()
                        }
                        await partner.value
                    }
                },
                .peer("withCheckedContinuation") { benchmark in
                    let roundTrips = benchmark.scaledIterations.count / 2
                    runTask("\(group)/withCheckedContinuation") {
                        let toPartner = ContinuationHandoff()
                        let toDriver = ContinuationHandoff()
                        let partner = Task {
                            for _ in 0..<roundTrips {
                                await toPartner.wait()
                                toDriver.signal()
                            }
                        }
                        for _ in 0..<roundTrips {
                            toPartner.signal()
                            await toDriver.wait()
                        }
                        await partner.value
                    }
                },
            ])
    }

    // MARK: 5. Contended async locks

    for tasks in [2, 4] {
        let group = "concurrency.async lock \(tasks) tasks"
        sideBySide(
            group: group, settings: kiloOperations,
            implementations: [
                Implementation("Spindle.AsyncLock", isReference: false) { benchmark in
                    let lock = AsyncLock()
                    countUnderLock("\(group)/Spindle.AsyncLock", tasks: tasks, operations: benchmark.scaledIterations.count) { counter in
                        // Never cancelled: `lock()` cannot throw here.
                        try! await lock.lock()
                        counter.value &+= 1
                        lock.unlock()
                    }
                },
                .reference("actor") { benchmark in
                    let n = benchmark.scaledIterations.count
                    runTask("\(group)/actor") {
                        let counter = CountingActor()
                        await contend(tasks: tasks, operations: n) { await counter.increment() }
                        if await counter.value != n / tasks * tasks {
                            report("\(group)/actor: count \(await counter.value), expected \(n / tasks * tasks)")
                        }
                    }
                },
                .peer("Spindle.Semaphore binary") { benchmark in
                    let semaphore = Spindle.Semaphore(value: 1)
                    countUnderLock("\(group)/Spindle.Semaphore binary", tasks: tasks, operations: benchmark.scaledIterations.count) { counter in
                        try! await semaphore.wait()
                        counter.value &+= 1
                        semaphore.signal()
                    }
                },
                .peer("Spindle.Lock no await inside") { benchmark in
                    let lock = Spindle.Lock()
                    countUnderLock("\(group)/Spindle.Lock no await inside", tasks: tasks, operations: benchmark.scaledIterations.count) { counter in
                        lock.withLock { counter.value &+= 1 }
                    }
                },
            ])
    }
}
