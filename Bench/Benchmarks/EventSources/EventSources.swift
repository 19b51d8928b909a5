// Event sources beside Dispatch's, the peer a user would pick instead (and,
// for the kinds Dispatch on Linux does not have, beside what a program does
// without an event layer): timer lateness, a read-source echo, custom add
// sources, signal, process-exit and file-write latency, and the cost of
// 10^4 idle sources. Each file's header says what its groups measure.
//
// Every wait a benchmark controls has a limit and reports a miss on stderr
// instead of hanging; a wrong count stops the run (sources.data.add).
import Benchmark
import BenchSupport

let benchmarks: @Sendable () -> Void = {
    timerBenchmarks()
    echoBenchmarks()
    dataAddBenchmarks()
    signalBenchmarks()
    processBenchmarks()
    vnodeBenchmarks()
    idleBenchmarks()
    pendingTimerBenchmarks()
}
