// jemalloc's settings for the programs linked with it (trainwatch_link_malloc
// in the top-level CMakeLists.txt: trainwatchd and the ingest sink it is
// measured against, so that both run on the same allocator, set alike).
// jemalloc reads this symbol at its first allocation; MALLOC_CONF in the
// environment is read after it and wins.
//
// thp:always: jemalloc asks for transparent huge pages (MADV_HUGEPAGE) on
// the memory it maps. Debian's kernels give huge pages only on request
// (/sys/kernel/mm/transparent_hugepage/enabled: madvise), so without it
// every 4 KiB page trainwatchd first touches is a page fault of its own.
// A fresh trainwatchd under the unpaced ingest load touched about 25,000 of
// them for 400,000 records (messages queued behind the writer, the batch's
// rows, SQLite's pages), at about 10 us a fault on a virtual machine; with
// huge pages it took about 4,000, and the bench's throughput load ran at
// 186,000-211,000 records/s against 169,000-180,000 (four alternated
// rounds, the sink unchanged). The price is memory: mappings grow in 2 MiB
// steps (20,000 runs created: peak RSS 354 MB against 314).
// metadata_thp:always: the same for jemalloc's own bookkeeping.
extern "C" {
const char* malloc_conf = "thp:always,metadata_thp:always";
}
