# Turns a binary file into a C array: cmake -DIN=file -DOUT=file.c -DNAME=symbol -P bin2c.cmake
# (the fatbin of rows.cu, embedded in the device layer so no file is looked up at run time).
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n\t" body "${body}")
file(WRITE ${OUT} "/* Generated from ${IN} by bin2c.cmake: do not edit. */\n"
	"__attribute__((aligned(64))) const unsigned char ${NAME}[] = {\n\t${body}\n};\n"
	"const unsigned long ${NAME}_size = ${bytes};\n")
