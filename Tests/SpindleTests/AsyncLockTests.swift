import Spindle
import Synchronization
import Testing
import TestSupport

/// Polls `condition` until it holds, for at most 60 s (generous: the default
/// executor's two threads here are shared with every test running in
/// parallel). Returns whether it held. Not a timing assertion: the tests use
/// it to wait for a state, such as a task being in line.
private func eventually(_ condition: () -> Bool) async -> Bool {
    let deadline = MonotonicClock.now.advanced(by: .seconds(60))
    while !condition() {
        if MonotonicClock.now >= deadline { return false }
        try? await Task.sleep(for: .milliseconds(1))
    }
    return true
}

/// Starts a task on Spindle's pool that waits for `lock`, records `id` in
/// `served` once it holds it, and unlocks; it records `-id - 1` instead if
/// its wait threw `CancellationError`.
private func queueUp(
    _ lock: AsyncLock, id: Int, _ served: LockedValue<[Int]>
) -> Task<Void, Never> {
    Task(executorPreference: WorkQueue.global()) {
        do {
            try await lock.lock()
        } catch {
            served.withLock { $0.append(-id - 1) }
            return
        }
        served.withLock { $0.append(id) }
        lock.unlock()
    }
}

/// A start line for a thread racing the test's task: the thread arrives and
/// spins until the task opens the gate (the task opens it at once, so the
/// spin is a few microseconds).
private final class Gate: Sendable {
    private let arrived = Atomic<Bool>(false)
    private let opened = Atomic<Bool>(false)
    var hasArrived: Bool { arrived.load(ordering: .acquiring) }
    func arrive() {
        arrived.store(true, ordering: .releasing)
        while !opened.load(ordering: .acquiring) {}
    }
    func open() { opened.store(true, ordering: .releasing) }
}

/// State of an actor that an `AsyncLock` keeps consistent across awaits
/// (the actor alone would not: it is reentrant at every `await`).
actor PairedLog {
    let lock = AsyncLock()
    private(set) var entries: [Int] = []

    /// Appends `value` twice with a suspension between: with the lock held
    /// throughout, no other call's entries come between the two.
    func appendTwice(_ value: Int) async throws {
        try await lock.withLock {
            entries.append(value)
            await Task.yield()
            entries.append(value)
        }
    }
}

@Suite("AsyncLock")
struct AsyncLockTests {
    @Test func lockTryLockAndUnlockUncontended() async throws {
        let lock = AsyncLock()
        #expect(lock.isIdle)
        try await lock.lock()
        #expect(!lock.isIdle)
        #expect(!lock.tryLock())
        lock.unlock()
        #expect(lock.isIdle)
        #expect(lock.tryLock())
        #expect(!lock.tryLock())
        lock.unlock()
        #expect(lock.isIdle)
    }

    /// A free lock goes to the line first: `tryLock` fails while tasks wait,
    /// even at the moment the holder unlocks (the lock is handed over, not
    /// freed).
    @Test func tryLockNeverJumpsTheLine() async throws {
        let lock = AsyncLock()
        let served = LockedValue<[Int]>([])
        try await lock.lock()
        let waiter = queueUp(lock, id: 0, served)
        #expect(await eventually { lock.waiterCount == 1 })
        #expect(!lock.tryLock())
        lock.unlock()
        // Handed to the waiter, so held until the waiter unlocks: a
        // `tryLock` that succeeds comes after the waiter was served.
        if lock.tryLock() {
            #expect(served.withLock { $0 } == [0])
            lock.unlock()
        }
        await waiter.value
        #expect(served.withLock { $0 } == [0])
        #expect(lock.isIdle)
    }

    /// The lock is held across suspension points: 8 tasks on the pool (on
    /// several threads) each enter 200 times with a `Task.yield()` inside,
    /// and never two are inside at once.
    @Test func mutualExclusionAcrossAwaits() async throws {
        let lock = AsyncLock()
        final class Counts: Sendable {
            let inside = Atomic<Int>(0)
            let overlaps = Atomic<Int>(0)
            let entries = Atomic<Int>(0)
        }
        let counts = Counts()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask(executorPreference: WorkQueue.global()) {
                    for _ in 0..<200 {
                        try! await lock.withLock {  // never cancelled
                            if counts.inside.add(1, ordering: .relaxed).newValue != 1 {
                                counts.overlaps.add(1, ordering: .relaxed)
                            }
                            await Task.yield()
                            counts.entries.add(1, ordering: .relaxed)
                            counts.inside.subtract(1, ordering: .relaxed)
                        }
                    }
                }
            }
        }
        #expect(counts.overlaps.load(ordering: .relaxed) == 0)
        #expect(counts.entries.load(ordering: .relaxed) == 1_600)
        #expect(lock.isIdle)
    }

    /// `withLock` runs its body in the caller's isolation: an actor's body
    /// mutates the actor's state directly, and the lock keeps each pair of
    /// entries together although the actor is reentrant at the `await`.
    @Test func withLockKeepsAnActorConsistentAcrossItsAwaits() async throws {
        let log = PairedLog()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for value in 0..<20 {
                group.addTask { try await log.appendTwice(value) }
            }
            try await group.waitForAll()
        }
        let entries = await log.entries
        #expect(entries.count == 40)
        for pair in stride(from: 0, to: entries.count, by: 2) {
            #expect(entries[pair] == entries[pair + 1])
        }
        #expect(log.lock.isIdle)
    }

    @Test func withLockReturnsTheBodysValueAndUnlocksWhenItThrows() async throws {
        struct Failure: Error {}
        let lock = AsyncLock()
        #expect(try await lock.withLock { 42 } == 42)
        #expect(lock.isIdle)
        await #expect(throws: Failure.self) {
            try await lock.withLock { throw Failure() }
        }
        #expect(lock.isIdle)
    }

    /// Tasks that wait are served in the order they arrived in line.
    @Test func waitersAreServedInArrivalOrder() async throws {
        let lock = AsyncLock()
        let served = LockedValue<[Int]>([])
        try await lock.lock()
        var waiters: [Task<Void, Never>] = []
        for id in 0..<10 {
            waiters.append(queueUp(lock, id: id, served))
            // The next one starts only once this one is in line.
            #expect(await eventually { lock.waiterCount == id + 1 })
        }
        lock.unlock()
        for waiter in waiters { await waiter.value }
        #expect(served.withLock { $0 } == Array(0..<10))
        #expect(lock.isIdle)
    }

    /// A waiter cancelled in line leaves it: its `lock()` throws, it holds
    /// nothing, the waiter behind it is served next, and no waiter record
    /// (nor any reference to the lock) is left behind.
    @Test func cancellingAWaiterEndsItsWaitAndTheNextIsServed() async throws {
        weak var weakLock: AsyncLock?
        do {
            let lock = AsyncLock()
            weakLock = lock
            let served = LockedValue<[Int]>([])
            try await lock.lock()
            let first = queueUp(lock, id: 0, served)
            #expect(await eventually { lock.waiterCount == 1 })
            let second = queueUp(lock, id: 1, served)
            #expect(await eventually { lock.waiterCount == 2 })
            first.cancel()
            await first.value
            #expect(served.withLock { $0 } == [-1])
            #expect(lock.waiterCount == 1)
            #expect(!lock.isIdle)  // still ours
            lock.unlock()
            await second.value
            #expect(served.withLock { $0 } == [-1, 1])
            #expect(lock.isIdle)
        }
        #expect(await eventually { weakLock == nil })
    }

    /// Already cancelled: a free lock is still taken; a held one makes
    /// `lock()` throw at once, without joining the line.
    @Test func aCancelledTaskTakesAFreeLockAndOtherwiseThrows() async throws {
        let lock = AsyncLock()
        let outcome = LockedValue<[String]>([])
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            do { try await lock.lock(); outcome.withLock { $0.append("took") } }
            catch { outcome.withLock { $0.append("threw") } }
            do { try await lock.lock(); outcome.withLock { $0.append("took") } }
            catch { outcome.withLock { $0.append("threw") } }
            #expect(lock.waiterCount == 0)
            lock.unlock()
        }
        await task.value
        #expect(outcome.withLock { $0 } == ["took", "threw"])
        #expect(lock.isIdle)
    }

    /// A cancellation racing the hand-off to its task: 300 rounds, each with
    /// three tasks in line, the holder unlocking on one thread while two of
    /// the tasks are cancelled from another. Whichever wins, a task either
    /// acquires (and then unlocks once) or throws holding nothing: every
    /// round serves or cancels each task exactly once, and the lock ends
    /// idle (a hand-off lost to a cancelled task would leave it held, and
    /// the round would never end).
    @Test(.timeLimit(.minutes(10)))  // a guard against a hang only: it took 52 s in a full parallel run, under 1 s alone
    func cancellationRacingTheHandOffNeverLosesTheLock() async throws {
        let lock = AsyncLock()
        for _ in 0..<300 {
            let served = LockedValue<[Int]>([])
            try await lock.lock()
            var waiters: [Task<Void, Never>] = []
            for id in 0..<3 {
                waiters.append(queueUp(lock, id: id, served))
                #expect(await eventually { lock.waiterCount == id + 1 })
            }
            // The canceller thread starts first and waits at a gate, so that
            // its cancellations and the unlock start together.
            let cancelled = waiters[0..<2]
            let gate = Gate()
            let canceller = startThread {
                gate.arrive()
                for waiter in cancelled { waiter.cancel() }
            }
            while !gate.hasArrived { await Task.yield() }
            gate.open()
            lock.unlock()
            canceller()
            for waiter in waiters { await waiter.value }
            let outcomes = served.withLock { $0 }
            #expect(outcomes.count == 3)
            #expect(Set(outcomes.map { $0 < 0 ? -$0 - 1 : $0 }) == [0, 1, 2])
            #expect(outcomes.contains(2))  // never cancelled: always served
            #expect(lock.isIdle)
        }
    }

    // MARK: Deadlines

    @Test func lockUntilADeadlineGivesUpAndLeavesTheLine() async throws {
        let lock = AsyncLock()
        try await lock.lock()
        let gotIt = await Task { try await lock.lock(timeout: .milliseconds(5)) }.result
        #expect((try? gotIt.get()) == false)
        #expect(lock.waiterCount == 0)
        // A deadline already past: the lock is held, so false at once.
        #expect(try await lock.lock(until: MonotonicClock.now) == false)
        lock.unlock()
        #expect(lock.isIdle)
        // Free: a past deadline still takes it.
        #expect(try await lock.lock(until: MonotonicClock.now) == true)
        lock.unlock()
        #expect(lock.isIdle)
    }

    @Test func lockUntilADeadlineIsHandedTheLock() async throws {
        let lock = AsyncLock()
        try await lock.lock()
        let waiter = Task { () throws(CancellationError) -> Bool in
            let got = try await lock.lock(timeout: .seconds(600))
            if got { lock.unlock() }
            return got
        }
        #expect(await eventually { lock.waiterCount == 1 })
        lock.unlock()
        #expect(try await waiter.value == true)
        #expect(lock.isIdle)
    }

    /// Contended `lock(timeout:)` calls with an hour's timeout, each served
    /// long before its deadline, leave no deadline behind once the lock is
    /// idle: the lock keeps one timer for the earliest deadline in its line,
    /// not one per task until that task's deadline (issue 38: 800,000 such
    /// acquisitions kept 800,000 timers, 83 MiB, for an hour). And no timer
    /// keeps the lock alive: dropped, it is freed at once.
    @Test func servedDeadlineWaitsLeaveNoTimersBehind() async throws {
        weak var freed: AsyncLock?
        do {
            let lock = AsyncLock()
            freed = lock
            let counter = LockedValue(0)
            let tasks = 8
            let rounds = 250
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<tasks {
                    group.addTask(executorPreference: WorkQueue.global()) {
                        for _ in 0..<rounds {
                            guard try! await lock.lock(timeout: .seconds(3600)) else { continue }
                            counter.withLock { $0 += 1 }
                            await Task.yield()  // held across a suspension: others queue
                            lock.unlock()
                        }
                    }
                }
            }
            #expect(counter.withLock { $0 } == tasks * rounds, "no wait timed out")
            #expect(lock.contendedLockCalls > 0, "some acquisitions queued with a deadline")
            #expect(lock.isIdle)
            #expect(lock.deadlinesInLine == 0)
            // The timer armed for the first queued deadline (an hour away)
            // may still be pending, and one more for each task whose
            // deadline, taken before another's, joined the line after that
            // one armed its timer (an earlier deadline arms its own): at
            // most one per task, never one per acquisition. (With a bound
            // of 1 this failed once in a full parallel run: 2 pending.)
            #expect(
                lock.pendingDeadlineTimers <= tasks,
                "\(lock.pendingDeadlineTimers) deadline timers pending after \(lock.contendedLockCalls) contended waits")
        }
        #expect(freed == nil, "a pending deadline timer kept the lock alive")
    }

    /// Deadlines in one line expire, each timing its own task out, while a
    /// waiter without one stays and is served; no timer is left pending once
    /// they have run. (Outcomes only: whichever way the two deadlines and the
    /// timers interleave, both waits end false.)
    @Test func deadlinesInOneLineExpireAndLeaveNoTimer() async throws {
        let lock = AsyncLock()
        try await lock.lock()
        let first = Task { try await lock.lock(timeout: .milliseconds(20)) }
        let second = Task { try await lock.lock(timeout: .milliseconds(40)) }
        let patient = Task { () throws(CancellationError) -> Bool in
            try await lock.lock()
            lock.unlock()
            return true
        }
        #expect(try await first.value == false)
        #expect(try await second.value == false)
        #expect(await eventually { lock.waiterCount == 1 })
        #expect(lock.deadlinesInLine == 0)
        #expect(lock.pendingDeadlineTimers == 0)
        lock.unlock()
        #expect(try await patient.value == true)
        #expect(lock.isIdle)
    }

    /// A task that joins the line with an earlier deadline than any timer
    /// pending schedules a timer of its own; one with a later deadline
    /// relies on the pending one. Cancelled waits take their deadlines out
    /// of the line; their timers stay pending (they cannot be cancelled) and
    /// find nothing due when they run.
    @Test func onlyAnEarlierDeadlineSchedulesATimer() async throws {
        let lock = AsyncLock()
        try await lock.lock()
        let late = Task { try await lock.lock(timeout: .seconds(3600)) }
        #expect(await eventually { lock.waiterCount == 1 })
        #expect(lock.pendingDeadlineTimers == 1)
        let later = Task { try await lock.lock(timeout: .seconds(7200)) }
        #expect(await eventually { lock.waiterCount == 2 })
        #expect(lock.pendingDeadlineTimers == 1)
        let early = Task { try await lock.lock(timeout: .seconds(1800)) }
        #expect(await eventually { lock.waiterCount == 3 })
        #expect(lock.pendingDeadlineTimers == 2)
        #expect(lock.deadlinesInLine == 3)
        for task in [late, later, early] { task.cancel() }
        for task in [late, later, early] { #expect(await task.result.isCancellation) }
        #expect(lock.deadlinesInLine == 0)
        #expect(lock.waiterCount == 0)
        lock.unlock()
        #expect(lock.isIdle)
    }
}

private extension Result {
    /// Whether the task threw `CancellationError`.
    var isCancellation: Bool {
        if case .failure(let error) = self { return error is CancellationError }
        return false
    }
}

@Suite("AsyncLock misuse")
struct AsyncLockMisuseTests {
    @Test func unlockingAnUnheldLockStopsWithAMessage() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            AsyncLock().unlock()
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("AsyncLock.unlock(): the lock is not locked"))
    }
}
