--- Small helpers shared by the modules: positions in the client's encoding, document
--- versions, across Neovim 0.10 to 0.12.

local M = {}

local api = vim.api
local has_011 = vim.fn.has('nvim-0.11') == 1

--- The character index (in `encoding`) of byte column `col` of `line`.
---@param line string
---@param col integer
---@param encoding string 'utf-8'|'utf-16'|'utf-32'
---@return integer
function M.char_index(line, col, encoding)
  col = math.max(0, math.min(col, #line))
  if encoding == 'utf-8' then
    return col
  end
  if has_011 then
    return vim.str_utfindex(line, encoding, col, false)
  end
  ---@diagnostic disable-next-line: param-type-mismatch, missing-parameter
  local utf32, utf16 = vim.str_utfindex(line, col)
  return encoding == 'utf-16' and utf16 or utf32
end

--- The byte column of character index `character` (in `encoding`) of `line`, clamped.
---@param line string
---@param character integer
---@param encoding string
---@return integer
function M.byte_col(line, character, encoding)
  if encoding == 'utf-8' then
    return math.max(0, math.min(character, #line))
  end
  local ok, col
  if has_011 then
    ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  else
    ---@diagnostic disable-next-line: param-type-mismatch
    ok, col = pcall(vim.str_byteindex, line, character, encoding == 'utf-16')
  end
  return ok and math.min(col, #line) or #line
end

--- An LSP position for a 0-based row and byte column of a buffer.
---@param bufnr integer
---@param row integer
---@param col integer
---@param encoding string
---@return lsp.Position
function M.position(bufnr, row, col, encoding)
  local line = api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  return { line = row, character = M.char_index(line, col, encoding) }
end

--- The 0-based row and byte column of an LSP position in a buffer.
---@param bufnr integer
---@param pos lsp.Position
---@param encoding string
---@return integer row, integer col
function M.byte_position(bufnr, pos, encoding)
  local line = api.nvim_buf_get_lines(bufnr, pos.line, pos.line + 1, false)[1] or ''
  return pos.line, M.byte_col(line, pos.character, encoding)
end

--- The document version Neovim last sent for `bufnr`.
---@param bufnr integer
---@return integer
function M.version(bufnr)
  local versions = vim.lsp.util.buf_versions
  return versions and versions[bufnr] or api.nvim_buf_get_changedtick(bufnr)
end

--- The next piece of a suggestion's `rest` (what it would still insert after the
--- cursor) that accepting a word or a line takes, as VS Code's acceptNextWord and
--- acceptNextLine do: a word is white space then a run of word characters (or of other
--- non-blank characters); a line is the rest of the cursor's line, or, when the rest
--- starts a new line, that line break and the line after it.
---@param rest string
---@param unit 'word'|'line'
---@return string
function M.next_piece(rest, unit)
  if unit == 'line' then
    return rest:match('^\n?[^\n]*') or rest
  end
  return rest:match('^%s*[%w_]+') or rest:match('^%s*[^%w_%s]+') or rest
end

return M
