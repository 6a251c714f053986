// jemalloc's settings for the programs linked with it (trainwatch_link_malloc
// in the top-level CMakeLists.txt: trainwatchd and the ingest sink it is
// measured against, so that both run on the same allocator, set alike).
// jemalloc reads this symbol at its first allocation; MALLOC_CONF in the
// environment is read after it and wins.
//
// thp:always: jemalloc asks for transparent huge pages (MADV_HUGEPAGE) on
// the memory it maps. Debian's kernels give huge pages only on request
// (/sys/kernel/mm/transparent_hugepage/enabled: madvise), so without it
// every 4 KiB page trainwatchd first touches is a page fault of its own,
// and a fresh trainwatchd under load touches many (messages queued behind
// the writer, the batch's rows, SQLite's pages); huge pages take several
// times fewer faults and raise unpaced ingest (make bench: ingest, and
// docs/benchmarks.md). The price is memory: mappings grow in 2 MiB steps.
// metadata_thp:always: the same for jemalloc's own bookkeeping.
extern "C" {
const char* malloc_conf = "thp:always,metadata_thp:always";
}
