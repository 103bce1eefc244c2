# Turns a text file into a C string constant (a NUL-terminated char array).
# Usage: cmake -DIN=file.sql -DOUT=file.c -DNAME=symbol -P embed.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}" "/* generated from ${IN}; do not edit */\nconst char ${NAME}[] = {${body} 0x00};\n")
