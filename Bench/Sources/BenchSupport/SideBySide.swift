import Benchmark

// How Spindle's benchmarks are named, so that rows can be shown side by side
// ===========================================================================
//
// Every benchmark measures one *group*: one operation, under one set of
// conditions, done by several *implementations*. Its name is
//
//     <group>/<implementation>              e.g. "atomic.add.32 relaxed/Spindle"
//     <group>/<implementation> [ref]        e.g. "atomic.add.32 relaxed/Synchronization.Atomic [ref]"
//
// - Exactly one implementation of a group is its *reference peer*: what a user
//   would pick instead of Spindle (Synchronization.Atomic, Synchronization.Mutex,
//   NIOLock, Foundation's Thread...). Its name ends in " [ref]". BenchReport
//   divides every row's median by the reference's median, so a ratio below 1
//   means faster than the peer.
// - Spindle's own rows are named "Spindle", or "Spindle.<variant>" when a
//   group has several (e.g. "Spindle.SpinLock"); BenchReport lists them first.
// - A group names the operation first, with dots, then the conditions after a
//   space: "lock.uncontended", "atomic.cas.64 sequentiallyConsistent",
//   "lock.contended 2 threads". Orderings are spelled as in Swift's APIs
//   (relaxed, acquiring, releasing, acquiringAndReleasing, sequentiallyConsistent).
// - Names may not contain "_" (package-benchmark's JMH export turns spaces into
//   underscores, and BenchReport turns them back), and an implementation may not
//   contain "/" or "[". sideBySide checks this when it registers.
// - package-benchmark appends a benchmark's tags to its name in parentheses.
//   sideBySide adds one tag, "ops", the number of operations one measured
//   iteration performs (the scaling factor), so that BenchReport can report the
//   time of one operation: "atomic.add.32 relaxed/Spindle (ops: 1000)". Do not
//   add tags of your own; put a parameter in the group name instead.
// - A group that reports more than its time (see ReportedMetrics.swift) gets a
//   second tag, "columns", naming those metrics joined by "+":
//   "lock.contended 2 threads/Spindle (columns: timePerOperation+fairness, ops: 1)".
//   BenchReport prints them as extra columns of that group only (fairness,
//   allocations and bytes per operation), or, for `timePerOperation`, takes
//   the row's time from it: a benchmark whose iteration runs for a fixed time
//   rather than a fixed number of operations measures its own time per
//   operation. Only rows that declare a metric show it, because the JMH export
//   lends a row that does not measure a metric another row's values.
//
// Every implementation of a group runs with the same configuration. A body is
// the measured iteration: it does `benchmark.scaledIterations.count`
// operations, usually through `benchmark.repeatOperation { ... }`, which
// passes each result to `blackHole` so the optimizer cannot drop it.
//
// Adding a benchmark target (Locks, Conditions, Threads, RunLoop...): make a
// folder Benchmarks/<Name>/ with a Swift file that defines
//
//     let benchmarks: @Sendable () -> Void = {
//         sideBySide(group: "...", spindle: { benchmark in ... },
//                    peers: [.reference("...") { benchmark in ... }])
//     }
//
// and add <Name> to `benchmarkFolders` in Package.swift, which makes it a
// target <Name>Benchmarks that can import Spindle, BenchSupport, Benchmark,
// Synchronization and NIOConcurrencyHelpers. scripts/bench, BenchReport and
// this file do not change.

/// One implementation of a group: its name, whether it is the group's
/// reference peer, and the body measured in each iteration.
public struct Implementation {
    /// The implementation's part of the benchmark name, e.g. "Spindle" or "NIOLock".
    public let name: String
    /// True for the one implementation per group that the others are compared to.
    public let isReference: Bool
    /// One measured iteration: `benchmark.scaledIterations.count` operations.
    public let body: (Benchmark) -> Void

    public init(_ name: String, isReference: Bool, body: @escaping (Benchmark) -> Void) {
        self.name = name
        self.isReference = isReference
        self.body = body
    }

    /// The reference peer of a group: what a user would pick instead of Spindle.
    public static func reference(_ name: String, body: @escaping (Benchmark) -> Void) -> Implementation {
        Implementation(name, isReference: true, body: body)
    }

    /// Another peer, shown in the group but not used as the ratio's denominator.
    public static func peer(_ name: String, body: @escaping (Benchmark) -> Void) -> Implementation {
        Implementation(name, isReference: false, body: body)
    }
}

/// How every implementation of one group is run.
public struct RunSettings {
    /// Operations per measured iteration. Large enough that reading the clock
    /// (about 20 ns) is lost in the noise: `.kilo` for operations of a few
    /// nanoseconds, `.one` for ones of microseconds.
    public var scalingFactor: BenchmarkScalingFactor
    /// Operations one measured iteration performs when that is not a power
    /// of 1,000 (10^5 jobs, say): the body does this many whatever
    /// `scaledIterations` says, and the "ops" tag and CPU time per operation
    /// use it. nil: `scalingFactor`'s count.
    public var operationsPerIteration: Int?
    /// Wall-clock time spent measuring one implementation, warm-up excluded.
    public var maxDuration: Duration
    /// Upper bound on measured iterations of one implementation.
    public var maxIterations: Int
    /// Unmeasured iterations run first, to warm caches and branch predictors.
    public var warmupIterations: Int
    /// Metrics besides wall-clock time and throughput, which are always
    /// measured (the JMH export that BenchReport reads needs throughput). Add
    /// e.g. `.mallocCountTotal` to count allocations. CPU time is read from
    /// /proc in scheduler ticks (10 ms) on Linux: useless below that.
    public var extraMetrics: [BenchmarkMetric]
    /// Metrics that BenchReport shows for this group beside (or, for
    /// `.timePerOperation`, instead of) the measured time; see
    /// ReportedMetrics.swift. Empty for most groups.
    public var reportedMetrics: [ReportedMetric]
    /// For a group that declares `.cpuPerOperation` but measures only part
    /// of its iteration (between `startMeasurement()` and
    /// `stopMeasurement()`, with setup or clean-up around it): true when the
    /// body records the CPU time of that part itself
    /// (`Benchmark.recordCPUTimePerOperation`), so that sideBySide does not
    /// measure it around the whole body, setup included. False for most groups.
    public var bodyRecordsCPU: Bool

    public init(
        scalingFactor: BenchmarkScalingFactor = .kilo,
        maxDuration: Duration = .milliseconds(400),
        maxIterations: Int = 100_000,
        warmupIterations: Int = 50,
        extraMetrics: [BenchmarkMetric] = [],
        reportedMetrics: [ReportedMetric] = [],
        bodyRecordsCPU: Bool = false,
        operationsPerIteration: Int? = nil
    ) {
        self.scalingFactor = scalingFactor
        self.operationsPerIteration = operationsPerIteration
        self.maxDuration = maxDuration
        self.maxIterations = maxIterations
        self.warmupIterations = warmupIterations
        self.extraMetrics = extraMetrics
        self.reportedMetrics = reportedMetrics
        self.bodyRecordsCPU = bodyRecordsCPU
    }

    /// Tuned for single operations of one to a few tens of nanoseconds:
    /// 1,000 operations per measurement, 0.4 s per implementation.
    public static var nanosecondOperations: RunSettings { RunSettings() }

    var configuration: Benchmark.Configuration {
        var metrics: [BenchmarkMetric] = [.wallClock, .throughput]
        for metric in extraMetrics + reportedMetrics.map(\.metric) where !metrics.contains(metric) {
            metrics.append(metric)
        }
        var tags = [operationsTag: String(operationsPerIteration ?? scalingFactor.rawValue)]
        if !reportedMetrics.isEmpty {
            tags[columnsTag] = reportedMetrics.map(\.name).joined(separator: columnsSeparator)
        }
        return Benchmark.Configuration(
            metrics: metrics,
            tags: tags,
            timeUnits: .automatic,
            warmupIterations: warmupIterations,
            scalingFactor: scalingFactor,
            maxDuration: maxDuration,
            maxIterations: maxIterations
        )
    }
}

/// The tag that carries the operations per measured iteration to BenchReport.
let operationsTag = "ops"

/// The suffix that marks a group's reference peer in a benchmark name.
public let referenceMarker = " [ref]"

/// Registers one benchmark per implementation of `group`, Spindle's first,
/// named by the convention at the top of this file.
///
/// Stops with a message if a name breaks the convention, or if `peers` does
/// not hold exactly one reference.
public func sideBySide(
    group: String,
    settings: RunSettings = .nanosecondOperations,
    spindle: @escaping (Benchmark) -> Void,
    peers: [Implementation]
) {
    sideBySide(
        group: group,
        settings: settings,
        implementations: [Implementation("Spindle", isReference: false, body: spindle)] + peers
    )
}

/// Registers one benchmark per implementation of `group`; use this form when
/// a group has several Spindle rows ("Spindle.SpinLock", "Spindle.Lock").
public func sideBySide(
    group: String,
    settings: RunSettings = .nanosecondOperations,
    implementations: [Implementation]
) {
    precondition(!group.isEmpty && !group.contains("_"),
                 "benchmark group '\(group)': must be non-empty and contain no '_'")
    precondition(!group.hasSuffix(" ") && !group.hasPrefix(" "),
                 "benchmark group '\(group)': no leading or trailing space")
    let references = implementations.filter(\.isReference)
    precondition(references.count == 1,
                 "benchmark group '\(group)': needs exactly one reference peer, has \(references.count)")
    var seen: Set<String> = []
    for implementation in implementations {
        let name = implementation.name
        precondition(!name.isEmpty && !name.contains("_") && !name.contains("/") && !name.contains("["),
                     "benchmark group '\(group)': implementation '\(name)' must be non-empty, without '_', '/' or '['")
        precondition(seen.insert(name).inserted,
                     "benchmark group '\(group)': implementation '\(name)' registered twice")
        let fullName = "\(group)/\(name)" + (implementation.isReference ? referenceMarker : "")
        // A group that declares `cpuPerOperation` gets it measured around
        // every implementation's iteration alike, partner threads included.
        // A body that measures part of its iteration records its own.
        let body = !settings.bodyRecordsCPU
            && settings.reportedMetrics.contains { $0.name == ReportedMetric.cpuPerOperation.name }
            ? measuringCPUPerOperation(implementation.body, operationsPerIteration: settings.operationsPerIteration)
            : implementation.body
        Benchmark(fullName, configuration: settings.configuration, closure: body)
    }
}

/// `body`, with the process's CPU time per scaled iteration recorded after
/// each call (`Benchmark.recordCPUTimePerOperation`), as a running average
/// since the first call. Not per call: Linux adds a thread's CPU time to
/// the process clock only when it is scheduled or at a scheduler tick (4 ms
/// here), so a partner thread that spins through a short iteration (1,000
/// hand-offs can take 0.2 ms) is missing from that iteration's reading.
/// Over the whole run (hundreds of ticks) the error is a tick per thread at
/// most, under 1% after half a second.
func measuringCPUPerOperation(
    _ body: @escaping (Benchmark) -> Void, operationsPerIteration: Int? = nil
) -> (Benchmark) -> Void {
    final class Totals {
        var start: Duration?
        var operations = 0
    }
    let totals = Totals()
    return { benchmark in
        if totals.start == nil { totals.start = ProcessCPUTime.now }
        body(benchmark)
        totals.operations += operationsPerIteration ?? benchmark.scaledIterations.count
        let cpu = ProcessCPUTime.now - totals.start!
        if totals.operations > 0 { benchmark.recordCPUTimePerOperation(cpu, operations: totals.operations) }
    }
}

extension Benchmark {
    /// Runs `operation` once per scaled iteration, handing each result to
    /// `blackHole` so that the optimizer cannot remove the work.
    ///
    /// `operation` is not escaping and this function is inlinable, so the
    /// operation is inlined into the loop: what is measured is the operation
    /// plus one call to `blackHole` (an unoptimized empty function, about a
    /// nanosecond), the same for every implementation of a group.
    @inlinable
    public func repeatOperation<Result>(_ operation: () -> Result) {
        for _ in scaledIterations {
            Benchmark.blackHole(operation())
        }
    }
}
