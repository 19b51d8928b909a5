// BenchReport: reads the JMH export of package-benchmark (`--format jmh`) and
// prints Spindle's rows beside their peers, with each row's ratio to the
// group's reference peer. Optionally writes the same rows as JSON records.
//
// The benchmark names follow the convention described in
// Sources/BenchSupport/SideBySide.swift:
//     <group>/<implementation>[ [ref]] (ops: N)
// where N is the number of operations one measured iteration performs.
//
// Why JMH: of package-benchmark 1.38.1's export formats it is the one that
// carries, in one JSON file for all targets, the exact 0th, 50th and 100th
// percentiles of every metric of every benchmark, with the target and the
// benchmark's name. Its quirks, which this tool undoes:
// - spaces in names become "_" (the convention forbids "_" in names);
// - time is in microseconds, rounded to 0.001 (1 ns per measured iteration,
//   far finer than the operation once divided by N);
// - per-iteration values, not per-operation: divided here by N from the tag;
// - a benchmark without the throughput metric is left out (BenchSupport
//   always measures it);
// - a metric a benchmark does not measure may carry the previous benchmark's
//   values (the exporter reuses one dictionary), so only metrics that every
//   benchmark registered through BenchSupport measures should be asked for:
//   wallClock (the default) and throughput. A group that measures more
//   declares it in a "columns" tag (BenchSupport's ReportedMetrics.swift), and
//   only the rows that declare a metric are shown with it.
//
// Declared metrics: `timePerOperation` (picoseconds per operation, measured by
// a benchmark whose iteration runs for a fixed time) replaces the wall clock
// divided by N for its rows; the others (`fairness`, `cpuPerOperation`, `longestWait`,
// `mallocCountTotal`, `mallocBytesCount`) become extra columns of their
// group, after the ratio.

import Foundation

// MARK: - Errors and usage

struct ReportError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

let usage = """
    usage: BenchReport [--metric NAME] [--json PATH] INPUT...

    Prints package-benchmark results side by side, one block per group,
    Spindle's rows first, each with its ratio to the group's reference peer.

    INPUT        a JMH export (swift package benchmark --format jmh), or a
                 directory holding *.jmh.json files
    --metric     the metric to report (default wallClock); one of
                 \(MetricKind.known.map(\.name).joined(separator: ", "))
                 (\(MetricKind.known.filter(\.isDeclaredOnly).map(\.name).joined(separator: " and ")): only the rows that declare them)
    --json PATH  also write the rows to PATH as a JSON array of records with
                 group, implementation, target, metric, unit, median, min, max,
                 ratio, reference (times in ns per operation), and, for rows
                 with extra columns, columns (their medians by metric name)
    -h, --help   print this text
    """

func fail(_ message: String, exitCode: Int32 = 1) -> Never {
    FileHandle.standardError.write(Data("BenchReport: error: \(message)\n".utf8))
    exit(exitCode)
}

// MARK: - Metrics

/// A metric of package-benchmark as it appears in the JMH export, and how a
/// per-iteration value becomes a per-operation one.
struct MetricKind {
    enum Scaling {
        /// A time: JMH gives µs per iteration; we report ns per operation.
        case timePerOperation
        /// A count that grows with the operations done: divide by N.
        case countPerOperation
        /// Throughput: JMH gives iterations per second; multiply by N.
        case operationsPerSecond
        /// A count that does not grow with the operations (peak memory, threads).
        case unscaled
        /// A value the benchmark recorded per operation in picoseconds: shown in ns.
        case picosecondsPerOperation
        /// A ratio the benchmark recorded in thousandths: shown as a fraction.
        case thousandths
    }

    /// The name given on the command line and written to the JSON records.
    let name: String
    /// The key in JMH's secondaryMetrics (package-benchmark's description of
    /// the metric), or nil for the primary metric (throughput).
    let jmhKey: String?
    let scaling: Scaling
    /// Measured only by the rows that declare it in their "columns" tag: a
    /// custom metric of BenchSupport's ReportedMetrics.swift.
    var isDeclaredOnly = false
    /// Shown beside the ratio when a row declares it (instead of being a
    /// metric that replaces another, like timePerOperation).
    var column: String? = nil
    /// Larger is better (fairness): the column shows the worst iteration too.
    var prefersLarger = false
    /// Nanoseconds shown in µs as the median and the range over iterations
    /// (longestWait).
    var showsRangeInMicroseconds = false

    var unit: String {
        switch scaling {
        case .timePerOperation, .picosecondsPerOperation: return "ns"
        case .countPerOperation, .unscaled: return "#"
        case .operationsPerSecond: return "ops/s"
        case .thousandths: return "fraction"
        }
    }

    // The descriptions are package-benchmark's `BenchmarkMetric.description`;
    // which metrics scale with the iteration count follows its
    // `useScalingFactor`.
    static let known: [MetricKind] = [
        MetricKind(name: "wallClock", jmhKey: "Time (wall clock)", scaling: .timePerOperation),
        MetricKind(name: "cpuTotal", jmhKey: "Time (total CPU)", scaling: .timePerOperation),
        MetricKind(name: "cpuUser", jmhKey: "Time (user CPU)", scaling: .timePerOperation),
        MetricKind(name: "cpuSystem", jmhKey: "Time (system CPU)", scaling: .timePerOperation),
        MetricKind(name: "throughput", jmhKey: nil, scaling: .operationsPerSecond),
        MetricKind(name: "instructions", jmhKey: "Instructions", scaling: .countPerOperation),
        MetricKind(name: "mallocCountTotal", jmhKey: "Malloc (total)", scaling: .countPerOperation, column: "mallocs/op"),
        MetricKind(name: "mallocCountSmall", jmhKey: "Malloc (small)", scaling: .countPerOperation),
        MetricKind(name: "mallocCountLarge", jmhKey: "Malloc (large)", scaling: .countPerOperation),
        MetricKind(name: "freeCountTotal", jmhKey: "Free (total)", scaling: .countPerOperation),
        MetricKind(name: "mallocBytesCount", jmhKey: "Malloc (bytes total)", scaling: .countPerOperation, column: "bytes/op"),
        MetricKind(name: "retainCount", jmhKey: "Retains", scaling: .countPerOperation),
        MetricKind(name: "releaseCount", jmhKey: "Releases", scaling: .countPerOperation),
        MetricKind(name: "syscalls", jmhKey: "Syscalls (total)", scaling: .countPerOperation),
        MetricKind(name: "contextSwitches", jmhKey: "Context switches", scaling: .unscaled),
        MetricKind(name: "threads", jmhKey: "Threads (peak)", scaling: .unscaled),
        MetricKind(name: "peakMemoryResident", jmhKey: "Memory (resident peak)", scaling: .unscaled),
        // BenchSupport's ReportedMetrics.swift: custom metrics, by the same names.
        MetricKind(
            name: "timePerOperation", jmhKey: "timePerOperation", scaling: .picosecondsPerOperation,
            isDeclaredOnly: true),
        MetricKind(
            name: "fairness", jmhKey: "fairness", scaling: .thousandths, isDeclaredOnly: true,
            column: "fairness (worst)", prefersLarger: true),
        MetricKind(
            name: "cpuPerOperation", jmhKey: "cpuPerOperation", scaling: .picosecondsPerOperation,
            isDeclaredOnly: true, column: "cpu ns/op"),
        MetricKind(
            name: "longestWait", jmhKey: "longestWait", scaling: .unscaled, isDeclaredOnly: true,
            column: "longest wait µs (range)", showsRangeInMicroseconds: true),
    ]

    /// The metric whose values stand for the wall clock in rows that declare it.
    static let timePerOperationName = "timePerOperation"

    static func named(_ name: String) -> MetricKind? {
        known.first { $0.name == name }
    }
}

// MARK: - The JMH export (only the fields used here)

struct JMHMetric: Decodable {
    let scorePercentiles: [String: Double]
    let scoreUnit: String
}

struct JMHElement: Decodable {
    let benchmark: String
    let primaryMetric: JMHMetric
    let secondaryMetrics: [String: JMHMetric]?
}

// MARK: - Names

/// A benchmark name taken apart by the convention.
struct RowName {
    let target: String
    let group: String
    let implementation: String
    let isReference: Bool
    let operationsPerIteration: Double
    /// The metrics the row declares in its "columns" tag (BenchSupport's
    /// ReportedMetrics.swift), e.g. ["timePerOperation", "fairness"].
    let columns: [String]

    var isSpindle: Bool {
        implementation == "Spindle" || implementation.hasPrefix("Spindle.")
    }

    /// Parses "package.benchmark.<target>.<name with spaces as _>".
    init(jmhBenchmark: String) throws {
        let prefix = "package.benchmark."
        guard jmhBenchmark.hasPrefix(prefix) else {
            throw ReportError("benchmark '\(jmhBenchmark)': expected a name starting with '\(prefix)'")
        }
        let rest = jmhBenchmark.dropFirst(prefix.count)
        guard let dot = rest.firstIndex(of: ".") else {
            throw ReportError("benchmark '\(jmhBenchmark)': no target before the name")
        }
        target = String(rest[..<dot])
        var name = rest[rest.index(after: dot)...].replacingOccurrences(of: "_", with: " ")
        let shown = name

        // Tags, appended by package-benchmark: " (key: value, key: value)".
        var tags: [String: String] = [:]
        if name.hasSuffix(")"), let open = name.range(of: " (", options: .backwards) {
            let list = name[open.upperBound..<name.index(before: name.endIndex)]
            for pair in list.components(separatedBy: ", ") {
                let parts = pair.components(separatedBy: ": ")
                guard parts.count == 2 else {
                    throw ReportError("benchmark '\(shown)' in \(target): cannot read tag '\(pair)'")
                }
                tags[parts[0]] = parts[1]
            }
            name = String(name[..<open.lowerBound])
        }
        guard let opsText = tags["ops"], let ops = Double(opsText), ops >= 1 else {
            throw ReportError(
                "benchmark '\(shown)' in \(target): no '(ops: N)' tag; register benchmarks with BenchSupport's sideBySide")
        }
        operationsPerIteration = ops
        columns = tags["columns"].map { $0.components(separatedBy: "+") } ?? []
        for column in columns {
            guard let kind = MetricKind.named(column),
                  kind.column != nil || column == MetricKind.timePerOperationName
            else {
                throw ReportError("benchmark '\(shown)' in \(target): unknown column '\(column)' in its 'columns' tag")
            }
        }

        isReference = name.hasSuffix(" [ref]")
        if isReference {
            name = String(name.dropLast(" [ref]".count))
        }
        guard let slash = name.lastIndex(of: "/"), slash != name.startIndex,
              name.index(after: slash) != name.endIndex
        else {
            throw ReportError("benchmark '\(shown)' in \(target): name is not '<group>/<implementation>'")
        }
        group = String(name[..<slash])
        implementation = String(name[name.index(after: slash)...])
    }
}

// MARK: - Rows

/// The median, min and max of one metric of one row, per operation, in the
/// metric's unit (ns for times).
struct Values {
    let median: Double
    let min: Double
    let max: Double
}

struct Row {
    let name: RowName
    let metric: MetricKind
    /// Per operation, in the metric's unit (ns for times).
    let median: Double
    /// The 99th percentile: the slow tail (for throughput, the 99th
    /// percentile of the time turned into a rate).
    let p99: Double
    let min: Double
    let max: Double
    var ratio: Double = .nan
    /// The extra columns the row declares, in MetricKind.known's order.
    var columns: [(kind: MetricKind, values: Values)] = []
}

func makeRow(_ element: JMHElement, metric: MetricKind) throws -> Row {
    let name = try RowName(jmhBenchmark: element.benchmark)
    var row = try readMetric(element, name: name, metric: metric)
    for kind in MetricKind.known
    where kind.column != nil && kind.name != metric.name && name.columns.contains(kind.name) {
        let values = try readMetric(element, name: name, metric: kind)
        row.columns.append((kind, Values(median: values.median, min: values.min, max: values.max)))
    }
    return row
}

/// One metric of one benchmark as a row (without ratio or extra columns).
func readMetric(_ element: JMHElement, name: RowName, metric requested: MetricKind) throws -> Row {
    // A row that measures its own time per operation shows it as its time
    // (and its throughput as the inverse).
    var metric = requested
    var inverted = false
    if name.columns.contains(MetricKind.timePerOperationName),
       requested.name == "wallClock" || requested.name == "throughput",
       let own = MetricKind.named(MetricKind.timePerOperationName)
    {
        inverted = requested.name == "throughput"
        metric = own
    }
    let source: JMHMetric
    if let key = metric.jmhKey {
        guard let found = element.secondaryMetrics?[key] else {
            throw ReportError(
                "benchmark '\(name.group)/\(name.implementation)' in \(name.target) has no '\(key)' metric")
        }
        source = found
    } else {
        source = element.primaryMetric
    }

    func percentile(_ key: String) throws -> Double {
        guard let value = source.scorePercentiles[key] else {
            throw ReportError(
                "benchmark '\(name.group)/\(name.implementation)': no \(key)th percentile in the export")
        }
        switch metric.scaling {
        case .timePerOperation:
            guard source.scoreUnit == "μs" || source.scoreUnit == "µs" || source.scoreUnit == "us" else {
                throw ReportError("metric \(metric.name): expected microseconds, the export says '\(source.scoreUnit)'")
            }
            return value * 1_000 / name.operationsPerIteration
        case .countPerOperation:
            return value / name.operationsPerIteration
        case .operationsPerSecond:
            return value * name.operationsPerIteration
        case .unscaled:
            return value
        case .picosecondsPerOperation:
            return value / 1_000
        case .thousandths:
            return value / 1_000
        }
    }
    if inverted {
        // Operations per second from ns per operation: the slowest
        // iteration gives the least throughput.
        return Row(
            name: name,
            metric: requested,
            median: 1e9 / (try percentile("50.0")),
            p99: 1e9 / (try percentile("99.0")),
            min: 1e9 / (try percentile("100.0")),
            max: 1e9 / (try percentile("0.0"))
        )
    }
    return Row(
        name: name,
        metric: requested,
        median: try percentile("50.0"),
        p99: try percentile("99.0"),
        min: try percentile("0.0"),
        max: try percentile("100.0")
    )
}

/// Groups rows, orders them (groups by name; in a group Spindle's rows, then
/// the reference, then the other peers) and fills in the ratios.
func arrange(_ rows: [Row]) throws -> [(group: String, rows: [Row])] {
    var byGroup: [String: [Row]] = [:]
    for row in rows {
        byGroup[row.name.group, default: []].append(row)
    }
    var result: [(group: String, rows: [Row])] = []
    for group in byGroup.keys.sorted() {
        var members = byGroup[group]!
        let references = members.filter(\.name.isReference)
        if references.count > 1 {
            throw ReportError("group '\(group)' has \(references.count) reference peers; exactly one is allowed")
        }
        var seen: Set<String> = []
        for member in members where !seen.insert(member.name.implementation).inserted {
            throw ReportError("group '\(group)' has two rows named '\(member.name.implementation)'")
        }
        if let reference = references.first?.median {
            for index in members.indices {
                members[index].ratio = members[index].name.isReference ? 1 : members[index].median / reference
            }
        } else {
            // A --filter that leaves the reference out, or an export that
            // dropped its row: the rows are still worth showing, without
            // ratios ("-"), and the reader is told why.
            let names = members.map(\.name.implementation).joined(separator: ", ")
            FileHandle.standardError.write(Data(
                "BenchReport: group '\(group)' has no reference row among \(names) (left out by the filter, or dropped from the export); its ratios are left empty\n".utf8))
        }
        func rank(_ row: Row) -> Int {
            row.name.isSpindle ? 0 : row.name.isReference ? 1 : 2
        }
        members.sort { (rank($0), $0.name.implementation) < (rank($1), $1.name.implementation) }
        result.append((group, members))
    }
    return result
}

// MARK: - Output

/// A unit for showing a group's times: the largest whose value for the
/// reference is at least 1.
func displayUnit(for rows: [Row]) -> (name: String, divisor: Double) {
    guard let metric = rows.first?.metric, metric.scaling == .timePerOperation,
          let reference = rows.first(where: \.name.isReference)?.median
    else {
        return (rows.first?.metric.unit ?? "", 1)
    }
    for (name, divisor) in [("s", 1e9), ("ms", 1e6), ("µs", 1e3)] where reference >= divisor {
        return (name, divisor)
    }
    return ("ns", 1)
}

/// Three significant digits, at most three decimals, no exponent.
func formatted(_ value: Double) -> String {
    guard value.isFinite else { return "-" }
    let magnitude = abs(value)
    let decimals = magnitude >= 100 ? 0 : magnitude >= 10 ? 1 : magnitude >= 1 ? 2 : 3
    return String(format: "%.\(decimals)f", value)
}

func padded(_ text: String, _ width: Int, right: Bool = true) -> String {
    let gap = String(repeating: " ", count: Swift.max(0, width - text.count))
    return right ? gap + text : text + gap
}

/// The text of an extra column's cell: the median, and for a metric where
/// larger is better the worst iteration in parentheses.
func columnCell(_ kind: MetricKind, _ values: Values) -> String {
    if kind.showsRangeInMicroseconds {
        return "\(formatted(values.median / 1e3)) (\(formatted(values.min / 1e3))–\(formatted(values.max / 1e3)))"
    }
    return kind.prefersLarger
        ? "\(formatted(values.median)) (\(formatted(values.min)))"
        : formatted(values.median)
}

/// The extra columns of a group: those any of its rows declares, in
/// MetricKind.known's order.
func extraColumns(of rows: [Row]) -> [MetricKind] {
    MetricKind.known.filter { kind in rows.contains { $0.columns.contains { $0.kind.name == kind.name } } }
}

func printTable(_ groups: [(group: String, rows: [Row])], metric: MetricKind) {
    let header = ["median", "p99", "min", "max", "unit", "ratio"]
    var cells: [[String]] = []
    for (_, rows) in groups {
        let unit = displayUnit(for: rows)
        for row in rows {
            cells.append([
                formatted(row.median / unit.divisor), formatted(row.p99 / unit.divisor), formatted(row.min / unit.divisor),
                formatted(row.max / unit.divisor), unit.name,
                row.ratio.isFinite ? String(format: "%.2f", row.ratio) : "-",
            ])
        }
    }
    let labels = groups.flatMap { group in
        group.rows.map { "  " + $0.name.implementation + ($0.name.isReference ? " [ref]" : "") }
    }
    let labelWidth = (groups.map(\.group.count) + labels.map(\.count)).max() ?? 0
    var widths = header.map(\.count)
    for row in cells {
        for (column, cell) in row.enumerated() {
            widths[column] = Swift.max(widths[column], cell.count)
        }
    }
    func line(_ label: String, _ columns: [String]) -> String {
        var text = padded(label, labelWidth, right: false)
        for (column, cell) in columns.enumerated() {
            text += "  " + padded(cell, widths[column], right: column != 3)
        }
        return text
    }

    // Extra columns (BenchSupport's reported metrics), only in the groups
    // that have them: one width per metric across the table.
    var extraWidths: [String: Int] = [:]
    for (_, rows) in groups {
        for kind in extraColumns(of: rows) {
            var width = Swift.max(extraWidths[kind.name] ?? 0, kind.column!.count)
            for row in rows {
                if let values = row.columns.first(where: { $0.kind.name == kind.name })?.values {
                    width = Swift.max(width, columnCell(kind, values).count)
                }
            }
            extraWidths[kind.name] = width
        }
    }
    func extras(_ kinds: [MetricKind], _ cell: (MetricKind) -> String) -> String {
        kinds.map { "  " + padded(cell($0), extraWidths[$0.name]!) }.joined()
    }

    switch metric.scaling {
    case .timePerOperation, .countPerOperation:
        print("\(metric.name) per operation; ratio = median / the reference peer's median (below 1: better)")
    case .operationsPerSecond:
        print("\(metric.name) in operations per second; ratio = median / the reference peer's median (above 1: better)")
    case .unscaled:
        print("\(metric.name) per measured iteration; ratio = median / the reference peer's median (below 1: better)")
    case .picosecondsPerOperation:
        print("\(metric.name) in ns; ratio = median / the reference peer's median (below 1: better)")
    case .thousandths:
        print("\(metric.name) per measured iteration; ratio = median / the reference peer's median (above 1: better)")
    }
    let allExtras = extraColumns(of: groups.flatMap(\.rows))
    if allExtras.contains(where: { $0.name == "fairness" }) {
        print("fairness = fewest / most operations of one thread in a measured iteration (1: equal shares);"
            + " median, worst iteration in parentheses")
    }
    if allExtras.contains(where: { $0.name == "longestWait" }) {
        print("longest wait = the most other threads' acquisitions between two of one thread's, times the"
            + " iteration's time per operation, in µs; median over iterations, range in parentheses")
    }
    if allExtras.contains(where: { $0.name == "mallocCountTotal" || $0.name == "mallocBytesCount" }) {
        print("mallocs/op, bytes/op = allocations and bytes requested from malloc per operation"
            + " (package-benchmark's count; malloc's header and rounding not included, except"
            + " that aligned allocations such as UnsafeMutablePointer.allocate count malloc's usable size)")
    }
    if allExtras.contains(where: { $0.name == "cpuPerOperation" }) {
        print("cpu ns/op = CPU time of the whole process (every thread, user + system) per operation, median;"
            + " above the time when more than one thread is busy; for hand-off groups the mean over the run"
            + " (the kernel counts a running partner's time only at scheduler ticks), so compare it across"
            + " the rows of its group rather than with the median time")
    }
    if groups.contains(where: { $0.rows.contains { $0.name.columns.contains(MetricKind.timePerOperationName) } }) {
        print("groups with fairness run each iteration for a fixed time; their time is that time"
            + " over the operations all threads completed")
    }
    var index = 0
    for (group, rows) in groups {
        let kinds = extraColumns(of: rows)
        print("")
        print(line(group, header) + extras(kinds) { $0.column! })
        for row in rows {
            print(line(labels[index], cells[index]) + extras(kinds) { kind in
                row.columns.first(where: { $0.kind.name == kind.name }).map { columnCell(kind, $0.values) } ?? "-"
            })
            index += 1
        }
    }
}

struct Record: Encodable {
    let group: String
    let implementation: String
    let target: String
    let metric: String
    let unit: String
    let median: Double
    let p99: Double
    let min: Double
    let max: Double
    /// nil when the group had no reference row.
    let ratio: Double?
    let reference: Bool
    /// The medians of the row's extra columns by metric name; absent when
    /// it has none.
    let columns: [String: Double]?
}

func writeJSON(_ groups: [(group: String, rows: [Row])], to path: String) throws {
    func rounded(_ value: Double) -> Double { (value * 10_000).rounded() / 10_000 }
    let records = groups.flatMap { group in
        group.rows.map { row in
            Record(
                group: row.name.group, implementation: row.name.implementation, target: row.name.target,
                metric: row.metric.name, unit: row.metric.unit,
                median: rounded(row.median), p99: rounded(row.p99), min: rounded(row.min), max: rounded(row.max),
                ratio: row.ratio.isFinite ? rounded(row.ratio) : nil, reference: row.name.isReference,
                columns: row.columns.isEmpty
                    ? nil
                    : Dictionary(uniqueKeysWithValues: row.columns.map { ($0.kind.name, rounded($0.values.median)) })
            )
        }
    }
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    var data = try encoder.encode(records)
    data.append(Data("\n".utf8))
    do {
        try data.write(to: URL(fileURLWithPath: path), options: .atomic)
    } catch {
        throw ReportError("cannot write \(path): \(error.localizedDescription)")
    }
}

// MARK: - Main

func inputFiles(_ paths: [String]) throws -> [String] {
    var files: [String] = []
    for path in paths {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw ReportError("no such file or directory: \(path)")
        }
        if isDirectory.boolValue {
            let found = try FileManager.default.contentsOfDirectory(atPath: path)
                .filter { $0.hasSuffix(".jmh.json") }
                .sorted()
                .map { (path as NSString).appendingPathComponent($0) }
            guard !found.isEmpty else {
                throw ReportError("no *.jmh.json file in \(path): did the benchmark run write its export there?")
            }
            files += found
        } else {
            files.append(path)
        }
    }
    return files
}

func run(_ arguments: [String]) throws {
    var metricName = "wallClock"
    var jsonPath: String?
    var inputs: [String] = []
    var remaining = arguments[...]
    while let argument = remaining.popFirst() {
        switch argument {
        case "-h", "--help":
            print(usage)
            return
        case "--metric", "--json":
            guard let value = remaining.popFirst() else {
                fail("\(argument) needs a value\n\(usage)", exitCode: 2)
            }
            if argument == "--metric" { metricName = value } else { jsonPath = value }
        case _ where argument.hasPrefix("-"):
            fail("unknown option \(argument)\n\(usage)", exitCode: 2)
        default:
            inputs.append(argument)
        }
    }
    guard !inputs.isEmpty else {
        fail("no input given\n\(usage)", exitCode: 2)
    }
    guard let metric = MetricKind.named(metricName) else {
        fail("unknown metric '\(metricName)'; known: \(MetricKind.known.map(\.name).joined(separator: ", "))",
             exitCode: 2)
    }

    var rows: [Row] = []
    for file in try inputFiles(inputs) {
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: file))
        } catch {
            throw ReportError("cannot read \(file): \(error.localizedDescription)")
        }
        let elements: [JMHElement]
        do {
            elements = try JSONDecoder().decode([JMHElement].self, from: data)
        } catch {
            throw ReportError("\(file) is not a JMH export of package-benchmark: \(error)")
        }
        for element in elements {
            if metric.isDeclaredOnly {
                // Another row's values stand in a row that does not measure it.
                let name = try RowName(jmhBenchmark: element.benchmark)
                guard name.columns.contains(metric.name) else { continue }
            }
            rows.append(try makeRow(element, metric: metric))
        }
    }
    guard !rows.isEmpty else {
        throw ReportError("no benchmark results in \(inputs.joined(separator: ", ")) (did the filter match nothing?)")
    }

    let groups = try arrange(rows)
    printTable(groups, metric: metric)
    if let jsonPath {
        try writeJSON(groups, to: jsonPath)
    }
}

do {
    try run(Array(CommandLine.arguments.dropFirst()))
} catch let error as ReportError {
    fail(error.description)
} catch {
    fail("\(error)")
}
