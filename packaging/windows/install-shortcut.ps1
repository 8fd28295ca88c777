<#
.SYNOPSIS
  Start-menu and desktop shortcuts that open Parley from this checkout's venv; -Uninstall removes them.
.DESCRIPTION
  Run from anywhere once the venv exists (python -m venv .venv; .venv\Scripts\pip install -r requirements.txt):
    powershell -ExecutionPolicy Bypass -File packaging\windows\install-shortcut.ps1
    powershell -ExecutionPolicy Bypass -File packaging\windows\install-shortcut.ps1 -Uninstall
  The shortcuts start .venv\Scripts\pythonw.exe main.py (no console window) with the Parley icon,
  for the current user only. -NoDesktop makes only the Start-menu shortcut.
#>
[CmdletBinding()]
param(
    [switch]$Uninstall,
    [switch]$NoDesktop,
    [string]$Python
)
$ErrorActionPreference = 'Stop'

$Root = (Resolve-Path (Join-Path $PSScriptRoot '..\..')).Path
if (-not $Python) { $Python = Join-Path $Root '.venv\Scripts\pythonw.exe' }
$Main = Join-Path $Root 'main.py'
$Icon = Join-Path $Root 'resources\icons\app\parley.ico'

$Folders = @([Environment]::GetFolderPath('Programs'))
if ($Uninstall -or -not $NoDesktop) { $Folders += [Environment]::GetFolderPath('Desktop') }
$Links = $Folders | ForEach-Object { Join-Path $_ 'Parley.lnk' }

if ($Uninstall) {
    foreach ($link in $Links) {
        if (Test-Path -LiteralPath $link) {
            Remove-Item -LiteralPath $link
            Write-Host "removed $link"
        }
    }
    return
}

if (-not (Test-Path -LiteralPath $Python)) {
    throw "$Python not found: create the venv first (python -m venv .venv; .venv\Scripts\pip install -r requirements.txt)"
}
if (-not (Test-Path -LiteralPath $Icon)) { throw "$Icon not found (run packaging\make_icons.py)" }

$Shell = New-Object -ComObject WScript.Shell
foreach ($link in $Links) {
    $shortcut = $Shell.CreateShortcut($link)
    $shortcut.TargetPath = $Python
    $shortcut.Arguments = '"' + $Main + '"'
    $shortcut.WorkingDirectory = $Root
    $shortcut.IconLocation = "$Icon,0"
    $shortcut.Description = 'Chat with a local vision-language model about pictures'
    $shortcut.Save()
    Write-Host "created $link -> $Python `"$Main`""
}
