import Benchmark

#if canImport(Glibc)
import Glibc
#endif

// Metrics a group reports besides its time
// ========================================
//
// Most groups report only the time of one operation. A few need more, and
// declare it in their RunSettings (`reportedMetrics`); sideBySide then names
// the metrics in a "columns" tag (see SideBySide.swift) so that BenchReport
// knows which rows really measured them. BenchReport knows each one by the
// `name` below; the two files must agree.
//
// - `timePerOperation`: for benchmarks whose measured iteration runs for a
//   fixed *time* (the contended lock groups: every thread works until a shared
//   flag says stop, so that a thread's share of the work is not fixed in
//   advance). The iteration cannot say beforehand how many operations it will
//   do, so package-benchmark's wall clock divided by the "ops" tag would not be
//   the time of one operation; the benchmark measures it itself, as the
//   iteration's elapsed time over the operations all threads completed, in
//   picoseconds (so that an integer keeps three decimals of a nanosecond).
//   BenchReport shows it in place of the wall clock, with the same median, min
//   and max over iterations, and the same ratio: below 1 means more
//   operations per second than the reference.
// - `fairness`: the fewest operations any thread completed in the iteration
//   divided by the most, in thousandths (1000: all threads got equal shares;
//   0: some thread got nothing). BenchReport shows the median over iterations
//   and, in parentheses, the worst iteration.
// - `mallocCount`, `mallocBytes`: package-benchmark's own malloc counters
//   (through the malloc interposer), per operation: allocations, and bytes
//   requested from malloc (malloc's own header and rounding come on top).
//   The interposer bills an aligned allocation (posix_memalign, which Swift's
//   UnsafeMutablePointer.allocate uses) at malloc's usable size instead, so a
//   40-byte pthread_mutex_t allocated that way counts 40 to 56 bytes.
// - `cpuPerOperation`: the CPU time the whole process spent (every thread,
//   user and system: CLOCK_PROCESS_CPUTIME_ID, exact to the nanosecond on
//   Linux, unlike package-benchmark's CPU metrics, read from /proc in 10 ms
//   ticks) over the measured part of an iteration, per operation, in
//   picoseconds. For rows where one thread waits for another: a waiter that
//   spins shows here what its speed costs. BenchReport shows it as a column
//   beside the time; a row that burns two cores shows about twice its time.
//   The clock counts another running thread's time only up to its last
//   scheduler tick (4 ms here), so a short iteration misses a spinning
//   partner: groups that declare the metric to sideBySide get it as a
//   running average over the whole run instead (SideBySide.swift).

// - `longestWait`: the longest any one thread went between two of its
//   acquisitions of the lock in an iteration, in nanoseconds. Counted, not
//   timed, so that no clock read slows the workers: each worker reads the
//   shared counter inside the lock (which it increments anyway) and keeps the
//   most acquisitions by other threads between two of its own (the
//   "bypasses"); the iteration's most, times its mean time per operation, is
//   the time. It includes one critical section and one stretch of work
//   outside, and any time the scheduler kept the thread off the CPU: a
//   thread kept out by barging threads, or by the scheduler, shows here.
//   BenchReport shows the median over iterations and their range.

/// A metric that a group measures and BenchReport prints for it.
public struct ReportedMetric {
    /// The name BenchReport knows the metric by, as it appears in the
    /// "columns" tag. No "_", "+", "," or ":".
    public let name: String
    /// What package-benchmark records.
    public let metric: BenchmarkMetric

    public init(name: String, metric: BenchmarkMetric) {
        precondition(
            !name.isEmpty && !name.contains(where: { "_+,: ()".contains($0) }),
            "reported metric '\(name)': the name may not contain '_', '+', ',', ':', ' ' or parentheses")
        self.name = name
        self.metric = metric
    }

    /// Time per operation measured by the benchmark itself, in picoseconds;
    /// see `Benchmark.recordTimePerOperation(elapsed:operations:)`.
    public static var timePerOperation: ReportedMetric {
        ReportedMetric(
            name: "timePerOperation",
            metric: .custom("timePerOperation", polarity: .prefersSmaller, useScalingFactor: false))
    }

    /// Fewest over most operations per thread, in thousandths; see
    /// `Benchmark.recordFairness(operationsPerThread:)`.
    public static var fairness: ReportedMetric {
        ReportedMetric(name: "fairness", metric: .custom("fairness", polarity: .prefersLarger, useScalingFactor: false))
    }

    /// The process's CPU time per operation, in picoseconds; see
    /// `Benchmark.recordCPUTimePerOperation(_:operations:)`.
    public static var cpuPerOperation: ReportedMetric {
        ReportedMetric(
            name: "cpuPerOperation",
            metric: .custom("cpuPerOperation", polarity: .prefersSmaller, useScalingFactor: false))
    }

    /// The longest gap between two acquisitions of one thread, in
    /// nanoseconds; see `Benchmark.recordLongestWait(_:)`.
    public static var longestWait: ReportedMetric {
        ReportedMetric(
            name: "longestWait", metric: .custom("longestWait", polarity: .prefersSmaller, useScalingFactor: false))
    }

    /// Allocations per operation, counted by package-benchmark.
    public static var mallocCount: ReportedMetric {
        ReportedMetric(name: "mallocCountTotal", metric: .mallocCountTotal)
    }

    /// Bytes requested from malloc per operation, counted by package-benchmark.
    public static var mallocBytes: ReportedMetric {
        ReportedMetric(name: "mallocBytesCount", metric: .mallocBytesCount)
    }
}

/// The tag that names a group's reported metrics, and what joins the names.
let columnsTag = "columns"
let columnsSeparator = "+"

extension Benchmark {
    /// Records the time of one operation for an iteration that did
    /// `operations` operations in `elapsed`: the `timePerOperation` metric,
    /// in picoseconds. Does nothing during warm-up iterations.
    public func recordTimePerOperation(elapsed: Duration, operations: Int) {
        precondition(operations > 0, "recordTimePerOperation: an iteration with no operation has no time per operation")
        let (seconds, attoseconds) = elapsed.components
        let picoseconds = Double(seconds) * 1e12 + Double(attoseconds) / 1e6
        measurement(ReportedMetric.timePerOperation.metric, Int((picoseconds / Double(operations)).rounded()))
    }

    /// Records the CPU time the process spent over an iteration that did
    /// `operations` operations (`cpu`: the difference of two
    /// `ProcessCPUTime.now` readings taken around the measured part): the
    /// `cpuPerOperation` metric, in picoseconds. Does nothing during warm-up
    /// iterations.
    public func recordCPUTimePerOperation(_ cpu: Duration, operations: Int) {
        precondition(operations > 0, "recordCPUTimePerOperation: an iteration with no operation has no CPU time per operation")
        let (seconds, attoseconds) = cpu.components
        let picoseconds = Double(seconds) * 1e12 + Double(attoseconds) / 1e6
        measurement(ReportedMetric.cpuPerOperation.metric, Int((picoseconds / Double(operations)).rounded()))
    }

    /// Records the longest time any thread of one iteration went between
    /// two of its acquisitions (see `longestWait`): the `longestWait`
    /// metric, in nanoseconds. Does nothing during warm-up iterations.
    public func recordLongestWait(_ wait: Duration) {
        let (seconds, attoseconds) = wait.components
        measurement(ReportedMetric.longestWait.metric, Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000))
    }

    /// Records how evenly the threads of one iteration shared the work: the
    /// `fairness` metric, fewest over most operations per thread, in
    /// thousandths. Does nothing during warm-up iterations.
    public func recordFairness(operationsPerThread: [Int]) {
        guard let most = operationsPerThread.max(), let fewest = operationsPerThread.min(), most > 0 else {
            preconditionFailure("recordFairness: no thread did any operation")
        }
        measurement(ReportedMetric.fairness.metric, fewest * 1000 / most)
    }
}

/// The CPU time this process has used so far: all its threads, live and
/// ended, user and system time (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`,
/// nanosecond resolution on Linux; one system call, under a microsecond).
/// Subtract two readings taken around the measured part of an iteration.
public enum ProcessCPUTime {
    public static var now: Duration {
        var time = timespec()
        let result = clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &time)
        precondition(result == 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed: errno \(errno)")
        return .seconds(time.tv_sec) + .nanoseconds(time.tv_nsec)
    }
}
