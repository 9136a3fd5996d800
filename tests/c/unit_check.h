/* The failure macros the C unit tests share. Each test defines UNIT_NAME
 * and keeps `phase` current, so a failure names the test, the phase and
 * the line. */
#ifndef UNIT_CHECK_H
#define UNIT_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static const char *phase = "setup";

#define FAIL(...)                                                                  \
    do {                                                                           \
        fprintf(stderr, UNIT_NAME ": FAIL [%s] %s:%d: ", phase, __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                                              \
        fputc('\n', stderr);                                                       \
        exit(1);                                                                   \
    } while (0)
#define CHECK(c, ...)          \
    do {                       \
        if (!(c))              \
            FAIL(__VA_ARGS__); \
    } while (0)

#endif
