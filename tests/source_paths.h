#pragma once

// The checkout's folders, for the tests that read its files. They are compiled into one small
// generated file (source_paths.cpp.in) and nowhere else, so that no other file's compile names
// the folder the checkout lies in.

namespace test {

// The checkout's top folder.
const char* source_dir();
// models/golden in it: the goldens Python writes.
const char* golden_dir();

}  // namespace test
