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
            rerunWithEnvironment("SPINDLE_PERTURB", "1234")
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
            guard getenv("SPINDLE_PERTURB") == nil else { exit(3) }
            SchedulePerturbation.enable(seed: 77)
            SchedulePerturbation.enable(seed: 77)  // the seed in force: nothing
            exit(SchedulePerturbation.seed == 77 ? 0 : 1)
        }
        #expect(text(r?.standardErrorContent).contains("Spindle: schedule perturbation on, SPINDLE_PERTURB=77\n"))

        let r2 = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            rerunWithEnvironment("SPINDLE_PERTURB", "5")
            SchedulePerturbation.enable(seed: 77)
            exit(SchedulePerturbation.seed == 5 ? 0 : 1)
        }
        #expect(text(r2?.standardErrorContent).contains("SPINDLE_PERTURB=5\n"))
        #expect(!text(r2?.standardErrorContent).contains("SPINDLE_PERTURB=77"))
    }

    @Test func aSecondSeedStopsWithAMessage() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            guard getenv("SPINDLE_PERTURB") == nil else { exit(3) }
            SchedulePerturbation.enable(seed: 1)
            SchedulePerturbation.enable(seed: 2)
        }
        #expect(text(r?.standardErrorContent).contains("already on with seed 1"))
    }

    @Test func anUnparsableSeedStopsWithAMessage() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            rerunWithEnvironment("SPINDLE_PERTURB", "12ab")
            Spindle.Lock().lock()
        }
        #expect(text(r?.standardErrorContent).contains("SPINDLE_PERTURB is '12ab'"))
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
            if getenv("SPINDLE_PERTURB") == nil { SchedulePerturbation.enable(seed: 7) }
            exit(checkGuaranteesUnderPerturbation())
        }
        #expect(text(r?.standardErrorContent).contains("schedule perturbation on"))
        let failures = text(r?.standardErrorContent).split(separator: "\n").filter { $0.hasPrefix("FAILED") }
        #expect(failures.isEmpty, "\(failures)")
    }
}

/// In an exit test's child: if `name` is not yet in the environment, runs
/// this same test process again with `name=value` added, in place of this
/// one (`execv` keeps the process id, so the parent waits for it as
/// before, and the exit test's own environment variables select the same
/// test). Returns only in the process that has it.
private func rerunWithEnvironment(_ name: String, _ value: String) {
    if let current = getenv(name), String(cString: current) == value { return }
    setenv(name, value, 1)
    execv("/proc/self/exe", CommandLine.unsafeArgv)
    writeToStandardError("execv failed: \(errno)\n")
    exit(4)
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
            guard getenv("SPINDLE_PERTURB") == nil else { exit(3) }
            SchedulePerturbation.enable(seed: 42)
            printDecisions()
            exit(0)
        }
    default:
        r = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            guard getenv("SPINDLE_PERTURB") == nil else { exit(3) }
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

    // Lock mutual exclusion: a plain counter and an "inside" count.
    final class Guarded: @unchecked Sendable {
        // @unchecked: `count` is guarded by `lock`; `inside` is atomic.
        let lock = Spindle.Lock()
        let rw = ReadWriteLock()
        var count = 0
        let inside = UnsafeMutablePointer<Int>.allocate(capacity: 1)
        let overlaps = UnsafeMutablePointer<Int>.allocate(capacity: 1)
        init() {
            inside.initialize(to: 0)
            overlaps.initialize(to: 0)
        }
    }
    let guarded = Guarded()
    runThreads(4) { i in
        for n in 0..<1_500 {
            let useReadWrite = n % 3 == 0
            if useReadWrite { guarded.rw.writeLock() } else { guarded.lock.lock() }
            if AtomicMemory.increment(guarded.inside, ordering: .relaxed) != 1 {
                AtomicMemory.increment(guarded.overlaps, ordering: .relaxed)
            }
            if useReadWrite {
                AtomicMemory.decrement(guarded.inside, ordering: .relaxed)
                guarded.rw.writeUnlock()
            } else {
                guarded.count += 1
                AtomicMemory.decrement(guarded.inside, ordering: .relaxed)
                guarded.lock.unlock()
            }
        }
    }
    if guarded.count != 4 * 1_000 { fail("Lock lost updates: \(guarded.count) of 4000") }
    if guarded.overlaps.pointee != 0 { fail("Lock or ReadWriteLock: \(guarded.overlaps.pointee) overlapping holds") }

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
    if group.wait(timeout: .seconds(60)) != .success { fail("serial queue: items did not finish") }
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
        let words = UnsafeMutablePointer<Int>.allocate(capacity: 4)  // running, barrierActive, done, violations
        init() { words.initialize(repeating: 0, count: 4) }
    }
    let concurrent = WorkQueue(label: "perturbed.concurrent", kind: .concurrent)
    let phases = Phases()
    let running = phases.words, barrierActive = phases.words + 1, done = phases.words + 2, violations = phases.words + 3
    let barrierGroup = WorkGroup()
    let itemsPerPhase = 40, barriers = 25
    for b in 0..<barriers {
        for _ in 0..<itemsPerPhase {
            concurrent.async(group: barrierGroup) {
                if AtomicMemory.load(from: barrierActive, ordering: .sequentiallyConsistent) != 0 {
                    AtomicMemory.increment(violations, ordering: .relaxed)
                }
                AtomicMemory.increment(running, ordering: .sequentiallyConsistent)
                if AtomicMemory.load(from: barrierActive, ordering: .sequentiallyConsistent) != 0 {
                    AtomicMemory.increment(violations, ordering: .relaxed)
                }
                AtomicMemory.decrement(running, ordering: .sequentiallyConsistent)
                AtomicMemory.increment(done, ordering: .sequentiallyConsistent)
            }
        }
        concurrent.asyncBarrier(group: barrierGroup) {
            AtomicMemory.store(1, to: barrierActive, ordering: .sequentiallyConsistent)
            if AtomicMemory.load(from: running, ordering: .sequentiallyConsistent) != 0 {
                AtomicMemory.increment(violations, ordering: .relaxed)
            }
            // Everything submitted before the barrier has finished.
            if AtomicMemory.load(from: done, ordering: .sequentiallyConsistent) != (b + 1) * itemsPerPhase {
                AtomicMemory.increment(violations, ordering: .relaxed)
            }
            AtomicMemory.store(0, to: barrierActive, ordering: .sequentiallyConsistent)
        }
    }
    if barrierGroup.wait(timeout: .seconds(60)) != .success { fail("barriers: items did not finish") }
    if violations.pointee != 0 { fail("barriers: \(violations.pointee) violations") }
    return broken
}

/// Writes `text` to file descriptor 2 in one call.
private func writeToStandardError(_ text: String) {
    var text = text
    text.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}
