import CShims
@testable import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

private let perturbedFromOutside = getenv("SPINDLE_PERTURB") != nil

/// Seeded schedule perturbation (`SchedulePerturbation`): off unless asked
/// for, on with its seed printed, the same decisions for the same seed, and
/// every guarantee intact while it perturbs. Each case that turns the mode
/// on runs in a child process (the mode cannot be turned off again).
@Suite struct SchedulePerturbationTests {
    private func text(_ bytes: [UInt8]?) -> String { String(decoding: bytes ?? [], as: UTF8.self) }

    @Test(.enabled(if: !perturbedFromOutside, "SPINDLE_PERTURB is set for this run"))
    func isOffByDefault() {
        #expect(SchedulePerturbation.seed == nil)
        #expect(!SchedulePerturbation.isEnabled)
        // The points do nothing and draw nothing while off.
        let lock = Spindle.Lock()
        lock.lock()
        lock.unlock()
        #expect(Perturbation.currentThreadIndex == nil)
    }

    /// The environment's seed turns the mode on at the first point, and the
    /// line that replays it is printed once.
    @Test func aSeedInTheEnvironmentTurnsItOnAndIsPrinted() async {
        let r = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            setPerturbSeedBeforeFirstPoint("1234")
            let lock = Spindle.Lock()
            for _ in 0..<100 {
                lock.lock()
                lock.unlock()
            }
            exit(SchedulePerturbation.seed == 1234 && Perturbation.currentThreadIndex != nil ? 0 : 1)
        }
        let printed = text(r?.standardErrorContent)
        #expect(printed.contains("Spindle: schedule perturbation on, SPINDLE_PERTURB=1234\n"))
        #expect(printed.components(separatedBy: "schedule perturbation on").count == 2, "printed once")
    }

    /// `enable(seed:)` turns it on from code and prints the same line; the
    /// environment's seed, when set, wins over the code's.
    @Test func enableTurnsItOnAndTheEnvironmentWins() async {
        let r = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            unsetenv("SPINDLE_PERTURB")  // this case sets its own seed
            SchedulePerturbation.enable(seed: 77)
            SchedulePerturbation.enable(seed: 77)  // the seed in force: nothing
            exit(SchedulePerturbation.seed == 77 ? 0 : 1)
        }
        let printed = text(r?.standardErrorContent)
        #expect(printed.contains("Spindle: schedule perturbation on, SPINDLE_PERTURB=77\n"))

        let r2 = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            setPerturbSeedBeforeFirstPoint("5")
            SchedulePerturbation.enable(seed: 77)
            exit(SchedulePerturbation.seed == 5 ? 0 : 1)
        }
        let printed2 = text(r2?.standardErrorContent)
        #expect(printed2.contains("SPINDLE_PERTURB=5\n"))
        #expect(!printed2.contains("SPINDLE_PERTURB=77"))
    }

    @Test func aSecondSeedStopsWithAMessage() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            unsetenv("SPINDLE_PERTURB")  // this case sets its own seed
            SchedulePerturbation.enable(seed: 1)
            SchedulePerturbation.enable(seed: 2)
        }
        let printed = text(r?.standardErrorContent)
        #expect(printed.contains("already on with seed 1"))
    }

    @Test func anUnparsableSeedStopsWithAMessage() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            setPerturbSeedBeforeFirstPoint("12ab")
            Spindle.Lock().lock()
        }
        let printed = text(r?.standardErrorContent)
        #expect(printed.contains("SPINDLE_PERTURB is '12ab'"))
    }

    /// The same seed gives each thread (numbered in the order of its first
    /// point) the same decisions; another seed gives others.
    @Test func theSameSeedGivesTheSameDecisions() async throws {
        let first = await decisionLog(seed: 42)
        let again = await decisionLog(seed: 42)
        let other = await decisionLog(seed: 43)
        let a = try #require(first)
        #expect(a.split(separator: "\n").count == 4)
        #expect(a.contains("thread 0:") && a.contains("thread 3:"))
        #expect(a == again)
        #expect(a != other)
        // Not degenerate: the threads' sequences differ, and every kind of
        // action occurs in 4 × 256 draws.
        let lines = a.split(separator: "\n").map { $0.drop(while: { $0 != ":" }) }
        #expect(Set(lines).count == 4)
        for kind in ["proceed", "yield", "spin", "sleep"] { #expect(a.contains(kind)) }
    }

    /// Locks still exclude, a serial queue still runs its items one at a
    /// time in order, and a barrier still runs alone, with the mode on.
    @Test func guaranteesHoldWhilePerturbed() async {
        let r = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            SchedulePerturbation.enable(seed: 7)  // or the environment's seed, if set
            // Always 0: the parent reads the verdicts (a failed exit
            // expectation would hide the output that names the failure).
            _ = checkGuaranteesUnderPerturbation()
            exit(0)
        }
        let printed = text(r?.standardErrorContent)
        #expect(printed.contains("schedule perturbation on"))
        let failures = printed.split(separator: "\n").filter { $0.hasPrefix("FAILED") }
        #expect(failures.isEmpty, "\(failures)")
    }
}

/// In an exit test's child, before any Spindle synchronization point has
/// run: puts `SPINDLE_PERTURB=value` in the environment, which the first
/// point then reads (as it would a variable set when the process started).
/// Exits with 5 if something already read the environment.
private func setPerturbSeedBeforeFirstPoint(_ value: String) {
    guard cshims_perturb_mode() == 1 else { exit(5) }  // 1: not yet read
    setenv("SPINDLE_PERTURB", value, 1)
}

/// Four threads, started one after another, each draw 256 decisions and
/// print them as one line.
private func decisionLog(seed: UInt64) async -> String? {
    // Exit-test bodies cannot capture, so the seed travels in the
    // environment's place: one body per seed.
    let r: ExitTest.Result?
    switch seed {
    case 42:
        r = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            unsetenv("SPINDLE_PERTURB")  // this case sets its own seed
            SchedulePerturbation.enable(seed: 42)
            printDecisions()
            exit(0)
        }
    default:
        r = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            unsetenv("SPINDLE_PERTURB")  // this case sets its own seed
            SchedulePerturbation.enable(seed: 43)
            printDecisions()
            exit(0)
        }
    }
    return r.map { String(decoding: $0.standardOutputContent, as: UTF8.self) }
}

private func printDecisions() {
    for _ in 0..<4 {
        let join = startThread {
            var line = ""
            for _ in 0..<256 { line += Perturbation.nextAction(at: .lockAcquire).description + "," }
            let index = Perturbation.currentThreadIndex ?? -1
            var text = "thread \(index): \(line)\n"
            text.withUTF8 { _ = write(1, $0.baseAddress, $0.count) }
        }
        join()
    }
}

/// Runs a stress of each guarantee with the mode on; prints a line starting
/// "FAILED" for each broken one and returns the number broken.
private func checkGuaranteesUnderPerturbation() -> Int32 {
    var broken: Int32 = 0
    func fail(_ what: String) {
        writeToStandardError("FAILED: \(what)\n")
        broken += 1
    }

    // Mutual exclusion: a plain counter under a `Lock`, and a count of
    // holders inside each lock (a second holder of the same lock at once
    // is an overlap).
    final class Guarded: @unchecked Sendable {
        // @unchecked: `count` is guarded by `lock`; `inside` and `overlaps`
        // are atomic words.
        let lock = Spindle.Lock()
        let rw = ReadWriteLock()
        var count = 0
        let inside = UnsafeMutablePointer<Int>.allocate(capacity: 2)  // [lock, rw]
        let overlaps = UnsafeMutablePointer<Int>.allocate(capacity: 1)
        init() {
            inside.initialize(repeating: 0, count: 2)
            overlaps.initialize(to: 0)
        }
    }
    let guarded = Guarded()
    runThreads(4) { _ in
        for n in 0..<1_500 {
            let useReadWrite = n % 3 == 0
            let inside = guarded.inside + (useReadWrite ? 1 : 0)
            if useReadWrite { guarded.rw.writeLock() } else { guarded.lock.lock() }
            if AtomicMemory.increment(inside, ordering: .relaxed) != 1 {
                AtomicMemory.increment(guarded.overlaps, ordering: .relaxed)
            }
            if !useReadWrite { guarded.count += 1 }
            AtomicMemory.decrement(inside, ordering: .relaxed)
            if useReadWrite { guarded.rw.writeUnlock() } else { guarded.lock.unlock() }
        }
    }
    if guarded.count != 4 * 1_000 { fail("Lock lost updates: \(guarded.count) of 4000") }
    if guarded.overlaps.pointee != 0 { fail("Lock or ReadWriteLock held twice at once: \(guarded.overlaps.pointee) times") }

    // Serial queue: FIFO from one submitter, one item at a time; items
    // submitted from several threads keep each thread's order.
    final class Trace: @unchecked Sendable {
        // @unchecked: `order` is only touched by the serial queue's items,
        // one at a time (that is what is checked); `running` is atomic.
        var order: [Int] = []
        let running = UnsafeMutablePointer<Int>.allocate(capacity: 1)
        let overlaps = UnsafeMutablePointer<Int>.allocate(capacity: 1)
        init() {
            running.initialize(to: 0)
            overlaps.initialize(to: 0)
        }
    }
    let serial = WorkQueue(label: "perturbed.serial")
    let trace = Trace()
    let group = WorkGroup()
    runThreads(2) { t in
        for n in 0..<1_000 {
            serial.async(group: group) {
                if AtomicMemory.increment(trace.running, ordering: .relaxed) != 1 {
                    AtomicMemory.increment(trace.overlaps, ordering: .relaxed)
                }
                trace.order.append(t * 1_000_000 + n)
                AtomicMemory.decrement(trace.running, ordering: .relaxed)
            }
        }
    }
    if group.wait(timeout: .seconds(60)) != .completed { fail("serial queue: items did not finish") }
    serial.sync {}
    for t in 0..<2 {
        let mine = trace.order.filter { $0 / 1_000_000 == t }.map { $0 % 1_000_000 }
        if mine != Array(0..<1_000) { fail("serial queue: thread \(t)'s items out of order or missing (\(mine.count))") }
    }
    if trace.overlaps.pointee != 0 { fail("serial queue: \(trace.overlaps.pointee) items overlapped") }

    // Barriers on a concurrent queue run alone, after everything before
    // them and before everything after.
    final class Phases: @unchecked Sendable {
        // @unchecked: every field is an atomic word.
        let words = UnsafeMutablePointer<Int>.allocate(capacity: 4)
        init() { words.initialize(repeating: 0, count: 4) }
        var running: UnsafeMutablePointer<Int> { words }
        var barrierActive: UnsafeMutablePointer<Int> { words + 1 }
        var done: UnsafeMutablePointer<Int> { words + 2 }
        var violations: UnsafeMutablePointer<Int> { words + 3 }
    }
    let concurrent = WorkQueue(label: "perturbed.concurrent", kind: .concurrent)
    let phases = Phases()
    let barrierGroup = WorkGroup()
    let itemsPerPhase = 40, barriers = 25
    for b in 0..<barriers {
        for _ in 0..<itemsPerPhase {
            concurrent.async(group: barrierGroup) {
                if AtomicMemory.load(from: phases.barrierActive, ordering: .sequentiallyConsistent) != 0 {
                    AtomicMemory.increment(phases.violations, ordering: .relaxed)
                }
                AtomicMemory.increment(phases.running, ordering: .sequentiallyConsistent)
                if AtomicMemory.load(from: phases.barrierActive, ordering: .sequentiallyConsistent) != 0 {
                    AtomicMemory.increment(phases.violations, ordering: .relaxed)
                }
                AtomicMemory.decrement(phases.running, ordering: .sequentiallyConsistent)
                AtomicMemory.increment(phases.done, ordering: .sequentiallyConsistent)
            }
        }
        concurrent.asyncBarrier(group: barrierGroup) {
            AtomicMemory.store(1, to: phases.barrierActive, ordering: .sequentiallyConsistent)
            if AtomicMemory.load(from: phases.running, ordering: .sequentiallyConsistent) != 0 {
                AtomicMemory.increment(phases.violations, ordering: .relaxed)
            }
            // Everything submitted before the barrier has finished.
            if AtomicMemory.load(from: phases.done, ordering: .sequentiallyConsistent) != (b + 1) * itemsPerPhase {
                AtomicMemory.increment(phases.violations, ordering: .relaxed)
            }
            AtomicMemory.store(0, to: phases.barrierActive, ordering: .sequentiallyConsistent)
        }
    }
    if barrierGroup.wait(timeout: .seconds(60)) != .completed { fail("barriers: items did not finish") }
    if phases.violations.pointee != 0 { fail("barriers: \(phases.violations.pointee) violations") }
    return broken
}

/// Writes `text` to file descriptor 2 in one call.
private func writeToStandardError(_ text: String) {
    var text = text
    text.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}
