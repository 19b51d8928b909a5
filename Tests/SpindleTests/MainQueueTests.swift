// The main queue (spec Q22-Q25, §1.12): a serial queue whose items run on
// the main thread, drained by `ThreadLoop.main` in its common modes or by
// `WorkQueue.runMain()`.
//
// Only the main thread runs the main loop, and no test runs there: Swift
// Testing holds the test process's main thread, and an exit test's body runs
// on another thread of the child process too (checked: its thread id is not
// the process id). So each case runs in an exit test that forks: the forked
// child has one thread, whose thread id is the child's process id, which
// makes it that process's main thread for the kernel and for Spindle
// (`NativeThread.main`; the wrapper checks both). The child reports through
// its exit status (0, or the number of the check that failed), which the
// exit test passes on; an alarm turns a hang into a failure.
#if canImport(Glibc)
import Glibc
#endif
import CShims
import Spindle
import Testing
import TestSupport

@Suite("Main queue")
struct MainQueueTests {
    /// Q22: items run on the main thread, one at a time, in the order
    /// submitted, whether submitted from the main thread or another one.
    @Test func itemsRunOnTheMainThreadOneAtATimeInOrder() async {
        await #expect(processExitsWith: .success) {
            runOnForkedMainThread(mainQueueItemsRunInOrderOnTheMainThread)
        }
    }

    /// Q23, Q25: the main loop drains the queue in the default mode and in
    /// a mode added to the common set, but not in a mode outside it: there
    /// a repeating timer keeps the run busy while the item stays queued, and
    /// the item runs on the next default-mode pass.
    @Test func mainLoopDrainsOnlyInCommonModes() async {
        await #expect(processExitsWith: .success) {
            runOnForkedMainThread(mainLoopDrainsInCommonModesOnly)
        }
    }

    /// Q23 and §1.12's bound: one pass of the main loop runs the items
    /// queued when the pass began, so the loop's other sources get their
    /// turn during a long backlog, and during a chain of items that each
    /// queue the next.
    @Test func longBacklogInterleavesWithOtherSources() async {
        await #expect(processExitsWith: .success) {
            runOnForkedMainThread(mainQueueBacklogInterleaves)
        }
    }

    /// Q24: without a loop of its own, a program calls `runMain()`, which
    /// drains the queue and never returns; here the last item ends the
    /// process.
    @Test func runMainDrainsTheQueueAndNeverReturns() async {
        await #expect(processExitsWith: .success) {
            runOnForkedMainThread(runMainDrainsTheMainQueue)
        }
    }
}

/// Forks; the child (whose one thread is its process's main thread) exits
/// with `body`'s result, or is killed by an alarm after 30 s. The caller
/// exits with the child's status (128 + the signal if one killed it).
func runOnForkedMainThread(_ body: () -> Int32) -> Never {
    let child = fork()
    if child == 0 {
        armHangAlarm(seconds: 30)
        guard cshims_gettid() == getpid(), NativeThread.isMainThread else { _exit(90) }
        _exit(body())
    }
    guard child > 0 else { exit(91) }
    var status: Int32 = 0
    guard waitpid(child, &status, 0) == child else { exit(92) }
    let signal = status & 0x7f
    exit(signal == 0 ? (status >> 8) & 0xff : 128 + signal)
}

/// Makes SIGALRM end the calling process after `seconds`. The thread that
/// forked was an exit test's, which blocks SIGALRM (with most signals), and
/// a forked child inherits its mask: without unblocking it, the alarm would
/// never arrive and a hang would stall the run instead of failing it.
func armHangAlarm(seconds: UInt32) {
    var alarmOnly = sigset_t()
    sigemptyset(&alarmOnly)
    sigaddset(&alarmOnly, SIGALRM)
    pthread_sigmask(SIG_UNBLOCK, &alarmOnly, nil)
    alarm(seconds)
}

/// Records which items ran, whether each ran on the main thread as an item
/// of the main queue, and how many ran at once.
private final class MainItemChecks: Sendable {
    let log = OrderLog()
    let occupancy = Occupancy()
    let misplaced = LockedValue(0)

    func run(_ i: Int) {
        _ = occupancy.enter()
        if !NativeThread.isMainThread || WorkQueue.current !== WorkQueue.main || !WorkQueue.main.isCurrent {
            misplaced.withLock { $0 += 1 }
        }
        log.append(i)
        occupancy.leave()
    }
}

private func mainQueueItemsRunInOrderOnTheMainThread() -> Int32 {
    let checks = MainItemChecks()
    // The main thread's first `async` makes the queue's source on the main
    // loop before any other thread submits (see `runMainDrainsTheMainQueue`).
    for i in 0..<500 {
        WorkQueue.main.async { checks.run(i) }
    }
    // The rest from a pool worker; the last one stops the loop.
    let producer = WorkItem {
        for i in 500..<1000 {
            WorkQueue.main.async {
                checks.run(i)
                if i == 999 { ThreadLoop.main.stop() }
            }
        }
    }
    WorkQueue.global().async(producer)
    guard ThreadLoop.main.run(mode: .default, timeout: .seconds(20)) == .stopped else { return 2 }
    guard producer.wait(timeout: .seconds(20)) == .completed else { return 3 }
    guard checks.log.all == Array(0..<1000) else { return 4 }
    guard checks.misplaced.withLock({ $0 }) == 0 else { return 5 }
    guard checks.occupancy.peak == 1 else { return 6 }
    // Outside any item the main thread still counts as the main queue's.
    guard WorkQueue.current == nil, WorkQueue.main.isCurrent else { return 7 }
    return 0
}

private func mainLoopDrainsInCommonModesOnly() -> Int32 {
    let loop = ThreadLoop.main
    let ran = LockedValue<[String]>([])

    // The default mode (a common mode from the start) drains the queue.
    WorkQueue.main.async { ran.withLock { $0.append("default") } }
    guard loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource
    else { return 2 }
    guard ran.withLock({ $0 }) == ["default"] else { return 3 }

    // A mode outside the common set does not: a repeating timer keeps the
    // run busy for 30 firings while the queued item stays unrun.
    let custom: LoopMode = "spindle.test.custom"
    let firings = LockedValue(0)
    let timer = LoopTimer(after: .zero, interval: .milliseconds(1)) { _ in
        let n = firings.withLock { count in
            count += 1
            return count
        }
        if n == 30 { ThreadLoop.main.stop() }
    }
    loop.add(timer, forMode: custom)
    WorkQueue.main.async { ran.withLock { $0.append("after custom") } }
    guard loop.run(mode: custom, timeout: .seconds(20)) == .stopped else { return 4 }
    guard firings.withLock({ $0 }) >= 30 else { return 5 }
    guard ran.withLock({ $0 }) == ["default"] else { return 6 }
    timer.invalidate()

    // The next default-mode pass runs it.
    guard loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource
    else { return 7 }
    guard ran.withLock({ $0 }) == ["default", "after custom"] else { return 8 }

    // A mode added to the common set drains it too.
    let tracking: LoopMode = "spindle.test.tracking"
    loop.addCommonMode(tracking)
    WorkQueue.main.async { ran.withLock { $0.append("tracking") } }
    guard loop.run(mode: tracking, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource
    else { return 9 }
    guard ran.withLock({ $0 }) == ["default", "after custom", "tracking"] else { return 10 }
    return 0
}

private func mainQueueBacklogInterleaves() -> Int32 {
    let loop = ThreadLoop.main
    let progress = LockedValue(0)
    let sourceSaw = LockedValue<[Int]>([])
    let other = LoopSource { _ in
        let now = progress.withLock { $0 }
        sourceSaw.withLock { $0.append(now) }
    }
    loop.add(other, forMode: .default)

    // A backlog of 300 items; the first queues 300 more and signals the
    // other source. The first pass runs the 300 present when it began, so
    // the other source runs after those and before any of the second batch.
    for i in 0..<300 {
        WorkQueue.main.async {
            progress.withLock { $0 += 1 }
            if i == 0 {
                for j in 0..<300 {
                    WorkQueue.main.async {
                        progress.withLock { $0 += 1 }
                        if j == 299 { ThreadLoop.main.stop() }
                    }
                }
                other.signal()
            }
        }
    }
    guard loop.run(mode: .default, timeout: .seconds(20)) == .stopped else { return 2 }
    guard progress.withLock({ $0 }) == 600 else { return 3 }
    guard sourceSaw.withLock({ $0 }) == [300] else { return 4 }

    // A chain: each item queues the next, 200 long. The other source,
    // signalled by the first link, runs while the chain still has links to
    // go; a drain that ran until the queue was empty would hold it back to
    // the end.
    progress.withLock { $0 = 0 }
    sourceSaw.withLock { $0 = [] }
    WorkQueue.main.async { chainLink(0, length: 200, progress: progress, signalling: other) }
    guard loop.run(mode: .default, timeout: .seconds(20)) == .stopped else { return 5 }
    guard progress.withLock({ $0 }) == 200 else { return 6 }
    let seen = sourceSaw.withLock { $0 }
    guard seen.count == 1, seen[0] < 200 else { return 7 }
    return 0
}

/// One link of the chain: counts itself, then queues the next link on the
/// main queue, or stops the main loop after the last.
private func chainLink(_ k: Int, length: Int, progress: LockedValue<Int>, signalling other: LoopSource) {
    progress.withLock { $0 = k + 1 }
    if k == 0 { other.signal() }
    if k + 1 < length {
        WorkQueue.main.async { chainLink(k + 1, length: length, progress: progress, signalling: other) }
    } else {
        ThreadLoop.main.stop()
    }
}

private func runMainDrainsTheMainQueue() -> Int32 {
    let checks = MainItemChecks()
    // The first item from the main thread, the rest from a pool worker,
    // possibly before the main thread gets to `runMain()`; the last item
    // exits with the verdict. (The main thread submits first so that the
    // main queue's source on the main loop is made by one thread alone: in
    // a child forked from a multithreaded process, two threads racing to
    // make a lazily made global can hang in the Swift runtime's once, whose
    // shared lock state the child inherited from the parent's threads.)
    WorkQueue.main.async { checks.run(0) }
    WorkQueue.global().async {
        for i in 1..<100 {
            WorkQueue.main.async {
                checks.run(i)
                if i == 99 {
                    let ok = checks.log.all == Array(0..<100)
                        && checks.misplaced.withLock({ $0 }) == 0
                        && checks.occupancy.peak == 1
                    exit(ok ? 0 : 3)
                }
            }
        }
    }
    WorkQueue.runMain()
}
