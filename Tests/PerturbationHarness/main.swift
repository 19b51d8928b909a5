// Planted concurrency bugs of the kinds users hit, each run `runs` times
// with schedule perturbation off and then on, counting the runs in which
// the bug shows. Not part of the test run (it measures; it asserts
// nothing): `swift run -c release PerturbationHarness [runs] [seed]`.
// The figures go in Spindle.docc/PerturbingSchedules.md.
//
// Each run is short (two threads or two items, about a millisecond
// when nothing is lost), and every run of one bug does the same work,
// so the counts compare the schedules and nothing else. Perturbation
// cannot be switched off again in a process, so the runs without it come
// first. SPINDLE_PERTURB must not be set (it would turn the mode on for the
// runs meant without it).

import Spindle
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

let arguments = CommandLine.arguments
let runs = arguments.count > 1 ? Int(arguments[1]) ?? 100 : 100
let seed = arguments.count > 2 ? UInt64(arguments[2]) ?? 1 : 1
if getenv("SPINDLE_PERTURB") != nil {
    writeToStandardError("PerturbationHarness: unset SPINDLE_PERTURB; the harness turns the mode on itself, after the runs without it\n")
    exit(2)
}

/// Two threads that start together: each spins until both have arrived.
func runPair(_ body: @escaping @Sendable (Int) -> Void) {
    withZeroedWords(Int.self, count: 1) { words in
        let arrived = SharedPointer(words)
        runThreads(2) { i in
            AtomicMemory.increment(arrived.pointer, ordering: .sequentiallyConsistent)
            while AtomicMemory.load(from: arrived.pointer, ordering: .sequentiallyConsistent) < 2 { spinLoopHint() }
            body(i)
        }
    }
}

/// (a) Check-then-act across an unlock: two threads withdraw 60 at a time
/// from a balance of 1,000 while it covers the withdrawal; each checks the
/// balance under the lock, unlocks, and takes the lock again to withdraw.
/// Found when the balance goes negative.
final class Account: @unchecked Sendable {
    // @unchecked: `balance` is guarded by `lock`.
    let lock = Spindle.Lock()
    var balance = 1_000
}

func checkThenAct() -> Bool {
    let account = Account()
    runPair { _ in
        while true {
            account.lock.lock()
            let enough = account.balance >= 60
            account.lock.unlock()
            guard enough else { return }
            account.lock.lock()
            account.balance -= 60
            account.lock.unlock()
        }
    }
    return account.balance < 0
}

/// (b) A lost wake-up: a producer computes a result, sets the flag without
/// the condition's lock, and signals. A waiter that has tested the flag
/// (false) and not yet begun to wait misses the signal and would sleep
/// forever; here it gives up after 20 ms. Found when the wait timed out
/// with the flag set.
final class Mailbox: @unchecked Sendable {
    // @unchecked: `ready` and `lost` are atomic words (`ready` set, wrongly,
    // without the lock).
    let condition = Spindle.Condition()
    let ready = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    let lost = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    init() {
        ready.initialize(to: 0)
        lost.initialize(to: 0)
    }
    deinit {
        ready.deallocate()
        lost.deallocate()
    }
}

/// About a microsecond of work that the optimizer cannot drop: the
/// producer's result, the first item's table.
@inline(never)
func work(_ n: Int) -> Int {
    var table = [Int](repeating: 0, count: n)
    for i in 1..<n { table[i] = table[i - 1] &+ i &* i }
    return table[n - 1]
}

func lostWakeUp() -> Bool {
    let mailbox = Mailbox()
    runPair { i in
        if i == 0 {
            mailbox.condition.lock()
            while AtomicMemory.load(from: mailbox.ready, ordering: .relaxed) == 0 {
                if mailbox.condition.wait(timeout: .milliseconds(20)) == .timedOut {
                    if AtomicMemory.load(from: mailbox.ready, ordering: .relaxed) != 0 {
                        AtomicMemory.store(1, to: mailbox.lost, ordering: .relaxed)
                    }
                    break
                }
            }
            mailbox.condition.unlock()
        } else {
            let result = work(256)
            AtomicMemory.store(result == 0 ? 2 : 1, to: mailbox.ready, ordering: .relaxed)  // the bug: not under the lock
            mailbox.condition.signal()
        }
    }
    return AtomicMemory.load(from: mailbox.lost, ordering: .relaxed) != 0
}

/// (c) An order assumption between two items of a concurrent queue: the
/// first fills a table, the second reads it, assuming the first has run
/// because it was submitted first (a concurrent queue only starts them in
/// order). Found when the second sees the table empty.
final class Table: @unchecked Sendable {
    // @unchecked: `filled` is an atomic word; the bug is in the order, not a race.
    let filled = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    let sawEmpty = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    init() {
        filled.initialize(to: 0)
        sawEmpty.initialize(to: 0)
    }
    deinit {
        filled.deallocate()
        sawEmpty.deallocate()
    }
}

let concurrentQueue = WorkQueue(label: "harness.concurrent", kind: .concurrent)

func orderAssumption() -> Bool {
    let table = Table()
    let group = WorkGroup()
    concurrentQueue.async(group: group) {
        let sum = work(256)  // building the table
        AtomicMemory.store(sum == 0 ? 2 : 1, to: table.filled, ordering: .releasing)
    }
    concurrentQueue.async(group: group) {
        if AtomicMemory.load(from: table.filled, ordering: .acquiring) == 0 { table.sawEmpty.pointee = 1 }
    }
    group.wait()
    return table.sawEmpty.pointee != 0
}

let bugs: [(name: String, run: () -> Bool)] = [
    ("(a) check-then-act across an unlock", checkThenAct),
    ("(b) lost wake-up, flag set without the lock", lostWakeUp),
    ("(c) order assumption, two items of a concurrent queue", orderAssumption),
]

@MainActor
func measure() -> [(found: Int, seconds: Double)] {
    bugs.map { bug in
        let start = MonotonicClock.now
        var found = 0
        for _ in 0..<runs where bug.run() { found += 1 }
        let seconds = Double(MonotonicClock.now.nanoseconds - start.nanoseconds) / 1e9
        return (found, seconds)
    }
}

func hundredths(_ seconds: Double) -> String {
    let centis = Int((seconds * 100).rounded())
    let fraction = centis % 100
    return "\(centis / 100).\(fraction < 10 ? "0" : "")\(fraction)"
}

let off = measure()
SchedulePerturbation.enable(seed: seed)
let on = measure()
print("| planted bug | runs | found, perturbation off | found, SPINDLE_PERTURB=\(seed) | time off / on |")
print("|---|---|---|---|---|")
for (i, bug) in bugs.enumerated() {
    let timeOff = hundredths(off[i].seconds)
    let timeOn = hundredths(on[i].seconds)
    print("| \(bug.name) | \(runs) | \(off[i].found) | \(on[i].found) | \(timeOff) s / \(timeOn) s |")
}

/// Writes `text` to file descriptor 2 in one call.
private func writeToStandardError(_ text: String) {
    var text = text
    text.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}
