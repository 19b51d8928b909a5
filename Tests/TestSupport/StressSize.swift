// The one place that decides how big a stress test runs, and the record of
// what each run did. `scripts/test` runs the stress suite at its CI size
// under ThreadSanitizer; `scripts/stress` runs it at full size
// (`SPINDLE_STRESS_SIZE=full`), in release and under TSan, and sums up the
// lines that `StressReport.record` appends to `SPINDLE_STRESS_REPORT`.
#if canImport(Glibc)
import Glibc
#endif

/// Whether this process runs under ThreadSanitizer. Swift has no compilation
/// condition for the sanitizer and the package defines none, so the check is
/// at run time: the TSan runtime, linked into every instrumented binary,
/// exports `__tsan_init`.
public let underThreadSanitizer: Bool = dlsym(nil, "__tsan_init") != nil

/// How big the stress tests run in this process, read once from
/// `SPINDLE_STRESS_SIZE`.
public enum StressSize: String, Sendable {
    /// The default: the sizes `scripts/test` runs under ThreadSanitizer in
    /// CI, scaled down so that the whole suite takes a few minutes there.
    case ci
    /// `SPINDLE_STRESS_SIZE=full`: the sizes the issues named (8 × 10^6
    /// items onto one serial queue, 10^6 actor hops, ...), or 10–20× the CI
    /// size where they named none. For `scripts/stress`, before a release.
    case full

    /// The size of this run. Any value of `SPINDLE_STRESS_SIZE` other than
    /// `ci`, `full` or empty stops the process with a message naming it, so
    /// that a misspelt request never runs the small sizes unnoticed.
    public static let current: StressSize = {
        guard let raw = getenv("SPINDLE_STRESS_SIZE"), raw.pointee != 0 else { return .ci }
        let text = String(cString: raw)
        guard let size = StressSize(rawValue: text) else {
            fatalError("SPINDLE_STRESS_SIZE is '\(text)': it must be 'ci' (the default) or 'full'")
        }
        return size
    }()
}

/// The size of a stress test's main parameter for this run: `ci` by default
/// (the size CI runs under ThreadSanitizer), `full` when
/// `SPINDLE_STRESS_SIZE=full`. Every stress test takes its item, round and
/// hop counts from here, so that one variable scales the whole suite.
public func stressSize<T: BinaryInteger>(ci: T, full: T) -> T {
    StressSize.current == .full ? full : ci
}

/// What a stress test did, for the summary `scripts/stress` prints: each
/// call appends one line to the file named by `SPINDLE_STRESS_REPORT` (and
/// does nothing when it is unset).
///
/// The line is tab-separated: the test (`File.function`, the file's name
/// without `.swift`), the operations it made, the threads (or processes,
/// tasks) that made them, the invariant checks it made (checked values, or
/// `#expect`s where each checks one whole result), the size (`ci` or
/// `full`), the build (`tsan` or `plain`) and the process id. The file is
/// opened with `O_APPEND` and the line written with one `write`, so that
/// lines from several processes (exit tests run in child processes) and
/// threads never interleave.
public enum StressReport {
    /// Appends this test's line to `SPINDLE_STRESS_REPORT`, if set. Call it
    /// once per test run (once per argument of a parameterized test), after
    /// its checks. A report file that cannot be opened stops the process
    /// with a message naming it: a summary that silently misses tests would
    /// claim less than ran, or hide that nothing did.
    public static func record(
        operations: Int, threads: Int, checks: Int,
        test: String = #function, file: String = #fileID
    ) {
        guard let raw = getenv("SPINDLE_STRESS_REPORT"), raw.pointee != 0 else { return }
        let path = String(cString: raw)
        let fileName = file.split(separator: "/").last.map(String.init) ?? file
        let stem = fileName.hasSuffix(".swift") ? String(fileName.dropLast(6)) : fileName
        let name = "\(stem).\(test)".filter { $0 != "\t" && $0 != "\n" }
        let build = underThreadSanitizer ? "tsan" : "plain"
        let line = "\(name)\t\(operations)\t\(threads)\t\(checks)\t\(StressSize.current.rawValue)\t\(build)\t\(getpid())\n"
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard fd >= 0 else {
            fatalError("StressReport: cannot open SPINDLE_STRESS_REPORT '\(path)' (errno \(errno))")
        }
        defer { close(fd) }
        let bytes = Array(line.utf8)
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if written != bytes.count {
            fatalError("StressReport: wrote \(written) of \(bytes.count) bytes to '\(path)' (errno \(errno))")
        }
    }
}
