// Work queues across fork() (DESIGN: after fork the child starts with fresh
// per-thread state): the child of a process whose pool had started workers
// has only the forking thread, and Spindle resets its pools and its poller
// there (keeping the delayed submissions), so the child's queues work.
#if canImport(Glibc)
import Glibc
#endif
import Spindle
import Testing
import TestSupport

@Suite("WorkQueue across fork")
struct WorkQueueForkTests {
    /// After the pool, a serial queue and the timer heap have run work,
    /// the process forks. In the child: a global `async`, a serial queue's
    /// `sync` queued behind other items, `async(after:)` and a group `wait`
    /// all complete. The parent waits for the child with `waitpid`, checks
    /// its exit status, and its own queues keep working. In an exit test, so
    /// the test runner's threads are not forked.
    @Test func queuesWorkInTheChildAfterFork() async {
        await #expect(processExitsWith: .success) {
            exit(forkAfterThePoolHasStarted())
        }
    }

    /// Queues whose drains run on pool workers at the fork (an item of a
    /// serial queue, two of a concurrent one, each blocked on a semaphore,
    /// with items queued behind them, and a queue targeting the serial one):
    /// in the child those workers do not exist, and the queues work again:
    /// `sync` returns after the items queued behind, a barrier runs, and
    /// the items that were running are lost. The child has an alarm: a hang
    /// fails the test.
    @Test func queuesWithADrainInFlightAtTheForkWorkInTheChild() async {
        await #expect(processExitsWith: .success) {
            exit(forkWhileDrainsAreInFlight())
        }
    }

    /// The forking thread runs an item of a serial queue (a `sync` on the
    /// idle queue, run on the calling thread) and one of a concurrent queue
    /// that a worker also runs an item of: in the child, the forking thread's
    /// items go on and end as usual, and both queues then work (a barrier
    /// waits for the forking thread's item, not for the lost one).
    @Test func forkingFromInsideItemsKeepsThoseItemsAndFreesTheLostOnes() async {
        await #expect(processExitsWith: .success) {
            exit(forkFromInsideItems())
        }
    }

    /// Forks repeatedly while other threads submit to a serial queue and
    /// wait for it (so its lock and drain are held at some forks): each
    /// child's `sync` on the queue returns.
    @Test func forkingWhileOtherThreadsUseAQueueLeavesItUsableInTheChild() async {
        await #expect(processExitsWith: .success) {
            exit(forkWhileOtherThreadsSubmit())
        }
    }

    /// Forks 300 times while another thread makes new generic type metadata
    /// without pause (so the Swift runtime's locks for optionals' and
    /// arrays' metadata are often held at the fork), with a queue timer and
    /// a delayed submission in the timer heap, and signal and file-system
    /// sources on a queue and on a loop: each child runs Spindle's fork
    /// handlers (the pools', the timer heap's, the event sources') and
    /// exits. A handler that makes metadata the parent did not make waits
    /// forever for a lock whose owner does not exist in the child; a child
    /// not gone after 10 s fails the test (it is killed). Tried: with the
    /// timer heap's handler made to make one new type, 3 runs of 3 failed.
    @Test func forkHandlersFinishWhileAnotherThreadMakesTypeMetadata() async {
        await #expect(processExitsWith: .success) {
            armHangAlarm(seconds: 240)
            exit(forkWhileMakingMetadata())
        }
    }
}

/// Two wrappers whose nestings spell a number in binary: every number is a
/// type no code has made yet.
private struct Zero<T> {}
private struct One<T> {}

/// Makes `[T?]` for the type `bits` levels of `Zero`/`One` around `T` that
/// spells `number`: new metadata for the nesting's deepest levels, and a
/// new optional and array each time.
@inline(never)
private func makeNewTypes<T>(_ number: UInt64, bits: Int, _ type: T.Type) -> Int {
    if bits == 0 {
        let made: [T?] = [nil]
        return made.count
    }
    return number & 1 == 0
        ? makeNewTypes(number >> 1, bits: bits - 1, Zero<T>.self)
        : makeNewTypes(number >> 1, bits: bits - 1, One<T>.self)
}

/// `forkHandlersFinishWhileAnotherThreadMakesTypeMetadata` in its own
/// process: 0, or the failed check (10: a child hung, and was killed).
private func forkWhileMakingMetadata() -> Int32 {
    signal(SIGUSR2, SIG_IGN)
    let queue = WorkQueue(label: "fork.metadata")
    var sources: [EventSource] = []
    defer { for source in sources { source.cancel() } }
    // Entries in both of the timer heap's heaps; the signal and
    // file-system registries of the pool and of a loop in use.
    let timer = EventSource.timer(start: .monotonic(MonotonicClock.now.advanced(by: .seconds(3600))), interval: .seconds(3600), on: .queue(queue))
    timer.setEventHandler { _ in }
    timer.activate()
    sources.append(timer)
    queue.async(after: .seconds(3600)) {}
    guard let loop = try? LoopThread.start(name: "fork.metadata") else { return 2 }
    defer { loop.loop.stop(); _ = try? loop.join() }
    let path = scratchPath("fork-metadata")
    guard writeFile(path, pattern(4)) else { return 3 }
    defer { unlink(path) }
    let fd = open(path, O_RDWR)
    guard fd >= 0 else { return 4 }
    defer { close(fd) }
    for target in [EventSource.Target.queue(queue), .loop(loop.loop)] {
        guard let signal = try? EventSource.signal(SIGUSR2, on: target),
              let file = try? EventSource.fileSystemObject(descriptor: fd, events: .write, on: target)
        else { return 5 }
        for source in [signal, file] {
            source.setEventHandler { _ in }
            source.activate()
            sources.append(source)
        }
    }

    let running = LockedValue(true)
    let made = LockedValue(0)
    guard let maker = try? NativeThread.start({ () -> Void in
        var number: UInt64 = 0
        while running.withLock({ $0 }) {
            number += 1
            _ = makeNewTypes(number, bits: 24, Int.self)
            made.withLock { $0 += 1 }
        }
    }) else { return 6 }
    // Until the maker is making types.
    while made.withLock({ $0 }) < 100 { usleep(1_000) }

    defer {
        running.withLock { $0 = false }
        _ = try? maker.join()
    }
    for round in 0..<300 {
        let child = fork()
        if child == 0 { _exit(0) }
        guard child > 0 else { return 7 }
        var status: Int32 = 0
        guard eventually(seconds: 10, { waitpid(child, &status, WNOHANG) != 0 }) else {
            // Stuck in a fork handler: killed, so that it does not keep the
            // exit test's pipes open.
            kill(child, SIGKILL)
            _ = waitpid(child, &status, 0)
            print("child \(round) was still in the fork handlers after 10 s (\(made.withLock { $0 }) type sets made)")
            return 10
        }
    }
    return 0
}

/// Returns 0 when the child and the parent passed, else the number of the
/// failed check (the child's own failures are its exit status; 128 + n for
/// a signal, such as the alarm that ends a hung child).
private func forkAfterThePoolHasStarted() -> Int32 {
    let serial = WorkQueue(label: "fork.serial")
    let warm = WorkGroup()
    for i in 0..<64 {
        WorkQueue.global().async(group: warm) { _ = (0..<1000).reduce(i, &+) }
    }
    for _ in 0..<16 { serial.async(group: warm) {} }
    let delayed = Semaphore(value: 0)
    WorkQueue.global().async(after: .milliseconds(1)) { _ = delayed.signal() }
    guard warm.wait(timeout: .seconds(30)) == .completed, delayed.wait(timeout: .seconds(30)) == .completed else { return 100 }
    guard WorkQueue.workerThreadCount(for: .default) > 0 else { return 101 }

    let child = fork()
    if child == 0 {
        armHangAlarm(seconds: 60)  // a hang fails the test instead of stalling it
        _exit(childUsesTheQueues(serial))
    }
    guard child > 0 else { return 102 }
    var status: Int32 = 0
    guard waitpid(child, &status, 0) == child else { return 103 }
    let signal = status & 0x7f
    let childResult = signal == 0 ? (status >> 8) & 0xff : 128 + signal
    guard childResult == 0 else { return childResult }

    // The parent's pool and queue are untouched by the child's reset.
    let after = WorkGroup()
    WorkQueue.global().async(group: after) {}
    serial.async(group: after) {}
    guard after.wait(timeout: .seconds(30)) == .completed else { return 104 }
    return 0
}

/// In the forked child: 0 if everything completed, else the failed check.
private func childUsesTheQueues(_ serial: WorkQueue) -> Int32 {
    // Only the forking thread came across.
    guard processThreadCount() == 1 else { return 10 }

    // A global async.
    let ran = Semaphore(value: 0)
    WorkQueue.global().async { _ = ran.signal() }
    guard ran.wait(timeout: .seconds(20)) == .completed else { return 11 }

    // The parent's serial queue: a sync queued behind 100 items, the first
    // of which waits for a global item, returns after all of them.
    let hold = Semaphore(value: 0)
    let log = OrderLog()
    serial.async { _ = hold.wait(timeout: .seconds(20)) }
    for i in 0..<100 { serial.async { log.append(i) } }
    WorkQueue.global().async { _ = hold.signal() }
    let countSeenBySync = serial.sync { log.count }
    guard countSeenBySync == 100, log.all == Array(0..<100) else { return 12 }

    // async(after:): the heap's holder is gone; a worker of the child's
    // holds the poller for it.
    let deadline = MonotonicClock.now.advanced(by: .milliseconds(5))
    let fired = Semaphore(value: 0)
    let early = LockedValue(false)
    serial.async(after: deadline) {
        if MonotonicClock.now < deadline { early.withLock { $0 = true } }
        _ = fired.signal()
    }
    guard fired.wait(timeout: .seconds(20)) == .completed else { return 13 }
    guard !early.withLock({ $0 }) else { return 14 }

    // A group of items on the global queue, waited for at once.
    let group = WorkGroup()
    let members = OrderLog()
    for i in 0..<50 {
        WorkQueue.global().async(group: group) { members.append(i) }
    }
    guard group.wait(timeout: .seconds(20)) == .completed else { return 15 }
    group.wait()
    guard members.all.sorted() == Array(0..<50) else { return 16 }

    // The child started workers of its own.
    guard WorkQueue.workerThreadCount(for: .default) > 0, processThreadCount() > 1 else { return 17 }
    return 0
}

/// Waits for a forked child; 0 if it exited with 0, else its status (128 +
/// the signal for a signal, such as the hang alarm), or `failure` if the
/// wait failed.
private func childResult(_ child: pid_t, failure: Int32) -> Int32 {
    guard child > 0 else { return failure }
    var status: Int32 = 0
    guard waitpid(child, &status, 0) == child else { return failure }
    let signal = status & 0x7f
    return signal == 0 ? (status >> 8) & 0xff : 128 + signal
}

/// Forks while a serial queue, a queue targeting it and a concurrent queue
/// each have a drain running an item blocked on a semaphore, with more
/// items queued behind; 0 when the child and the parent passed.
private func forkWhileDrainsAreInFlight() -> Int32 {
    let serial = WorkQueue(label: "fork.inflight.serial")
    let chained = WorkQueue(label: "fork.inflight.chained", target: serial)
    let concurrent = WorkQueue(label: "fork.inflight.concurrent", kind: .concurrent)
    let entered = Semaphore(value: 0)
    let release = Semaphore(value: 0)
    let serialLog = OrderLog()
    let chainedLog = OrderLog()
    let concurrentLog = OrderLog()

    // The drains take their items (a serial drain takes a batch) and block
    // in them; what is queued after that stays in the queues' rings.
    serial.async {
        _ = entered.signal()
        _ = release.wait(timeout: .seconds(60))
    }
    for _ in 0..<2 {
        concurrent.async {
            _ = entered.signal()
            _ = release.wait(timeout: .seconds(60))
        }
    }
    for _ in 0..<3 { guard entered.wait(timeout: .seconds(30)) == .completed else { return 100 } }
    for i in 0..<10 { serial.async { serialLog.append(i) } }
    // Its drain is an item of `serial`, queued behind the ten.
    for i in 0..<10 { chained.async { chainedLog.append(i) } }
    concurrent.asyncBarrier { concurrentLog.append(-1) }
    for i in 0..<10 { concurrent.async { concurrentLog.append(i) } }

    let child = fork()
    if child == 0 {
        armHangAlarm(seconds: 60)  // a hang fails the test instead of stalling it
        _exit(childUsesQueuesWhoseDrainsWereLost(serial, chained, concurrent, serialLog, chainedLog, concurrentLog))
    }
    for _ in 0..<3 { _ = release.signal() }
    let result = childResult(child, failure: 101)
    guard result == 0 else { return result }

    // The parent's queues ran everything, in order.
    let serialSeen = serial.sync { serialLog.all }
    guard serialSeen == Array(0..<10) else { return 102 }
    guard chained.sync({ chainedLog.all }) == Array(0..<10) else { return 103 }
    concurrent.syncBarrier {}
    guard concurrentLog.all.first == -1, concurrentLog.all.dropFirst().sorted() == Array(0..<10) else { return 104 }
    return 0
}

/// In the forked child of `forkWhileDrainsAreInFlight`: 0 if every check
/// passed, else the failed check.
private func childUsesQueuesWhoseDrainsWereLost(
    _ serial: WorkQueue, _ chained: WorkQueue, _ concurrent: WorkQueue,
    _ serialLog: OrderLog, _ chainedLog: OrderLog, _ concurrentLog: OrderLog
) -> Int32 {
    // The items queued behind the lost one run, in order, before the sync.
    let seen = serial.sync { serialLog.all }
    guard seen == Array(0..<10) else { return 11 }
    // The queue targeting it: its drain (queued on `serial` in the parent)
    // is made again.
    guard chained.sync({ chainedLog.all }) == Array(0..<10) else { return 12 }
    // The concurrent queue's lost items no longer count as running: the
    // barrier runs, then the items after it.
    concurrent.syncBarrier {}
    let concurrentSeen = concurrentLog.all
    guard concurrentSeen.first == -1, concurrentSeen.dropFirst().sorted() == Array(0..<10) else { return 13 }
    // And the queues go on working.
    let group = WorkGroup()
    let more = OrderLog()
    for i in 0..<20 {
        serial.async(group: group) { more.append(i) }
        chained.async(group: group) {}
        concurrent.async(group: group) {}
    }
    concurrent.asyncBarrier(group: group) {}
    guard group.wait(timeout: .seconds(30)) == .completed, more.all == Array(0..<20) else { return 14 }
    return 0
}

/// Forks on the main thread inside a `sync` item of a serial queue, nested
/// in a `sync` item of a concurrent queue one of whose items a worker runs;
/// 0 when the child and the parent passed.
private func forkFromInsideItems() -> Int32 {
    let serial = WorkQueue(label: "fork.inside.serial")
    let concurrent = WorkQueue(label: "fork.inside.concurrent", kind: .concurrent)
    let entered = Semaphore(value: 0)
    let release = Semaphore(value: 0)
    concurrent.async {
        _ = entered.signal()
        _ = release.wait(timeout: .seconds(60))
    }
    guard entered.wait(timeout: .seconds(30)) == .completed else { return 100 }
    let log = OrderLog()
    var child: pid_t = -1
    concurrent.sync {
        serial.sync {
            child = fork()
            if child == 0 {
                armHangAlarm(seconds: 60)
                // Still inside both items: queued behind them.
                serial.async { log.append(1) }
                concurrent.asyncBarrier { log.append(2) }
            }
        }
    }
    if child == 0 {
        // Out of both items now: they ended as usual, and what was queued
        // behind them runs.
        guard serial.sync({ log.all.contains(1) }) else { _exit(20) }
        concurrent.syncBarrier {}
        guard log.all.sorted() == [1, 2] else { _exit(21) }
        let group = WorkGroup()
        for _ in 0..<10 {
            serial.async(group: group) {}
            concurrent.async(group: group) {}
        }
        guard group.wait(timeout: .seconds(30)) == .completed else { _exit(22) }
        _exit(0)
    }
    _ = release.signal()
    let result = childResult(child, failure: 101)
    guard result == 0 else { return result }
    concurrent.syncBarrier {}
    serial.sync {}
    return 0
}

/// Forks 40 times while two threads submit to one serial queue and wait
/// for it; 0 when every child passed.
private func forkWhileOtherThreadsSubmit() -> Int32 {
    let queue = WorkQueue(label: "fork.busy")
    let stop = LockedValue(false)
    let done = Semaphore(value: 0)
    let warmed = Semaphore(value: 0)
    for _ in 0..<2 {
        WorkQueue.global().async {
            var n = 0
            while !stop.withLock({ $0 }) {
                queue.async {}
                if n & 7 == 0 { queue.sync {} }
                n &+= 1
                if n == 256 { _ = warmed.signal() }
            }
            _ = done.signal()
        }
    }
    // The forks start once both submitters are past their first rounds: a
    // parent thread making a type's metadata for the first time at the fork
    // holds a Swift runtime lock that the child can never take (a limit of
    // Swift after `fork()`, see `ForkHandlers`); this test is about the
    // queue's own lock and drain.
    for _ in 0..<2 { guard warmed.wait(timeout: .seconds(30)) == .completed else { return 100 } }
    var failure: Int32 = 0
    for _ in 0..<40 where failure == 0 {
        let child = fork()
        if child == 0 {
            armHangAlarm(seconds: 30)
            let ran = LockedValue(false)
            queue.async { ran.withLock { $0 = true } }
            queue.sync {}
            _exit(ran.withLock { $0 } ? 0 : 30)
        }
        failure = childResult(child, failure: 101)
    }
    stop.withLock { $0 = true }
    for _ in 0..<2 { guard done.wait(timeout: .seconds(30)) == .completed else { return 102 } }
    return failure
}
