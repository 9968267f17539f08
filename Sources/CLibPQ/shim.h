#ifndef CLIBPQ_SHIM_H
#define CLIBPQ_SHIM_H
/* libpq, PostgreSQL's own client library (apt: libpq-dev; pkg-config adds -I/usr/include/postgresql).
   None of the calls used is variadic or a macro, so nothing needs wrapping: the header exists so
   the module map names one file, as CSQLite's and CCurl's do. */
#include <libpq-fe.h>
#endif
