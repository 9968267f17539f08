#ifndef CSQLITE_SHIM_H
#define CSQLITE_SHIM_H
#include <sqlite3.h>
/* SQLITE_TRANSIENT is a cast macro Swift cannot import. */
static inline sqlite3_destructor_type CSQLite_TRANSIENT(void) { return (sqlite3_destructor_type)-1; }
#endif
