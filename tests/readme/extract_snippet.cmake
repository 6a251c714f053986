# Writes the first fenced block of LANG in README to OUT, so that the README's
# snippets are compiled and run by the tests rather than copied into them.
#   cmake -DREADME=... -DLANG=cpp -DOUT=... -P extract_snippet.cmake
file(READ "${README}" text)
string(FIND "${text}" "```${LANG}\n" start)
if(start EQUAL -1)
  message(FATAL_ERROR "${README} has no ```${LANG} block")
endif()
string(LENGTH "```${LANG}\n" fence)
math(EXPR start "${start} + ${fence}")
string(SUBSTRING "${text}" ${start} -1 rest)
string(FIND "${rest}" "\n```" end)
if(end EQUAL -1)
  message(FATAL_ERROR "the ```${LANG} block of ${README} is not closed")
endif()
string(SUBSTRING "${rest}" 0 ${end} block)
file(WRITE "${OUT}.tmp" "${block}\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
