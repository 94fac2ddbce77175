#Requires -RunAsAdministrator
<#
.SYNOPSIS
    Runs kstack under Driver Verifier: turn Verifier on for kstack.sys,
    reboot, run the client smoke suite, read Verifier's counters, turn it off.

.DESCRIPTION
    docs/driver-verifier.md is the runbook; in short:

      .\verifier-smoke.ps1 -Phase enable -Restart   # verifier /standard /driver kstack.sys
      .\verifier-smoke.ps1                          # after the reboot: the smoke suite
      .\verifier-smoke.ps1 -Phase reset -Restart    # verifier /reset

    The smoke suite (-Phase run) needs the kstack service created
    (kstack-service.ps1 -Action create) and kstack.sys signed. It starts
    kstack, checks that Verifier watches kstack.sys (verifier /query), then
    runs through kstack.exe: status (text and JSON), selftest, a watch of
    every source with activity that fires it (its captured counter must
    grow), the timer source (sampled when DisablePagingExecutive is 1,
    otherwise refused with 0xE0B50001 as designed), configuration changes
    and refusals, read and clear (no trace record left after it: module
    records, which every kstack.exe run adds, stay), and -Cycles stop/start
    cycles, each unload leaving no pool allocation behind (every kstack.exe
    is closed before a stop, and a stop that stays STOP_PENDING fails the
    step with the reason). It always ends with verifier /query and the line
    "N passed, N failed", even when kstack never started; everything is
    also written to a transcript.

    A clean run: no bug check (a Verifier failure stops the machine with a
    blue screen, 0xC4 DRIVER_VERIFIER_DETECTED_VIOLATION and the like, and
    leaves a dump), every step passed, and kstack.sys in verifier /query.

.PARAMETER Phase
    enable (turn Verifier on for kstack.sys), run (the smoke suite; the
    default) or reset (turn Verifier off).

.PARAMETER Cycles
    Stop/start cycles in the run phase (default 10).

.PARAMETER WatchSeconds
    How long each source is watched (default 3).

.PARAMETER LogDir
    Where the transcript goes (default: the current user's TEMP folder).

.PARAMETER Restart
    With enable or reset: reboot right away.

.PARAMETER PackageDir
    The package folder (default: the folder above this script, else the
    repository's target\kstack-package).

.EXAMPLE
    .\verifier-smoke.ps1 -Phase enable -Restart

.EXAMPLE
    .\verifier-smoke.ps1 -Cycles 25
#>
[CmdletBinding()]
param(
    [ValidateSet('enable', 'run', 'reset')]
    [string] $Phase = 'run',
    [ValidateRange(1, 1000)]
    [int] $Cycles = 10,
    [ValidateRange(1, 60)]
    [int] $WatchSeconds = 3,
    [string] $LogDir = $env:TEMP,
    [switch] $Restart,
    [string] $PackageDir
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
Import-Module (Join-Path $PSScriptRoot 'kstack-common.psm1') -Force

function Invoke-Verifier {
    param([Parameter(Mandatory = $true)] [string[]] $Arguments)
    Write-Host ('> verifier.exe {0}' -f ($Arguments -join ' '))
    # verifier.exe's exit codes are not documented; callers check its output.
    return (Invoke-Native -FilePath 'verifier.exe' -Arguments $Arguments).Text
}

function Restart-OrSay {
    param([Parameter(Mandatory = $true)] [string] $Next)
    if ($Restart) {
        Restart-Computer -Force
    } else {
        Write-Host ('Reboot now (Restart-Computer), then {0}' -f $Next)
    }
}

if ($Phase -eq 'enable') {
    if (-not (Get-KStackDriver)) {
        throw ('{0} Create it first so Verifier has a driver to watch.' -f (Get-ScErrorExplanation -Code 1060))
    }
    Write-Host (Invoke-Verifier -Arguments @('/standard', '/driver', 'kstack.sys'))
    $settings = Invoke-Verifier -Arguments @('/querysettings')
    Write-Host $settings
    if ($settings -notmatch 'kstack\.sys') {
        throw 'verifier /querysettings does not list kstack.sys: the setting did not take.'
    }
    Restart-OrSay -Next 'run .\verifier-smoke.ps1 (the smoke suite).'
    return
}

if ($Phase -eq 'reset') {
    Write-Host (Invoke-Verifier -Arguments @('/reset'))
    Restart-OrSay -Next 'Verifier is off.'
    return
}

# ---- the smoke suite ----

$log = Join-Path $LogDir ('kstack-verifier-{0}.log' -f (Get-Date -Format 'yyyyMMdd-HHmmss'))
Start-Transcript -LiteralPath $log | Out-Null
$script:passed = 0
$script:failed = 0
$package = $null

function Step {
    param([Parameter(Mandatory = $true)] [string] $Name, [Parameter(Mandatory = $true)] [scriptblock] $Body)
    Write-Host ''
    Write-Host ('== {0}' -f $Name)
    try {
        & $Body
        $script:passed++
        Write-Host ('PASS {0}' -f $Name)
    } catch {
        $script:failed++
        Write-Host ('FAIL {0}: {1}' -f $Name, $_.Exception.Message)
    }
}

function Get-SourceStatus {
    param([Parameter(Mandatory = $true)] [string] $Source)
    $status = Get-KStackStatus -PackageDir $package
    $entry = @($status.sources | Where-Object { $_.name -eq $Source })
    if ($entry.Count -ne 1) {
        throw ('status --json has no source {0}' -f $Source)
    }
    return $entry[0]
}

# kstack.exe read --json: one JSON object a trace record, one a line.
function Get-KStackRecords {
    $lines = (Invoke-KStack -PackageDir $package -Arguments @('read', '--json')).Output -split "`n"
    foreach ($line in $lines) {
        if ($line.Trim()) {
            $line | ConvertFrom-Json
        }
    }
}

# Work that makes each source fire while it is watched.
function Invoke-Activity {
    param([Parameter(Mandatory = $true)] [string] $Source)
    for ($i = 0; $i -lt 5; $i++) {
        switch ($Source) {
            'registry' {
                $key = 'HKCU:\Software\kstack-smoke'
                New-Item -Path $key -Force | Out-Null
                New-ItemProperty -LiteralPath $key -Name 'Touch' -Value $i -PropertyType DWord -Force | Out-Null
                Remove-Item -LiteralPath $key -Recurse -Force
            }
            'object' {
                # Opening a handle to each process runs the process handle callback.
                foreach ($process in [System.Diagnostics.Process]::GetProcesses()) {
                    try {
                        $null = $process.Handle
                    } catch {
                        # Protected processes refuse; the others are enough.
                        $null = $_
                    } finally {
                        $process.Dispose()
                    }
                }
            }
            'ondemand' {
                Invoke-KStack -PackageDir $package -Arguments @('selftest') | Out-Null
            }
            default {
                # process, thread, image: a short-lived process creates a
                # process and threads and loads images.
                Start-Process -FilePath "$env:SystemRoot\System32\cmd.exe" -ArgumentList '/c', 'exit' -WindowStyle Hidden -Wait
            }
        }
    }
}

# Watches one source while Invoke-Activity fires it; its captured counter
# must grow and watch must end cleanly.
function Test-Source {
    param([Parameter(Mandatory = $true)] [string] $Source, [string[]] $Extra = @())
    $before = Get-SourceStatus -Source $Source
    if (-not $before.available) {
        throw ('source {0} is not available on this kernel (registration {1})' -f $Source, $before.registration)
    }
    Invoke-KStack -PackageDir $package -Arguments (@('config', '--disable', 'all')) | Out-Null
    Invoke-KStack -PackageDir $package -Arguments (@('config', '--enable', $Source) + $Extra) | Out-Null
    $out = Join-Path $LogDir ('kstack-watch-{0}.txt' -f $Source)
    $err = Join-Path $LogDir ('kstack-watch-{0}.err.txt' -f $Source)
    $watch = Start-Process -FilePath (Join-Path $package 'kstack.exe') `
        -ArgumentList 'watch', '--duration', "$WatchSeconds" -NoNewWindow -PassThru `
        -RedirectStandardOutput $out -RedirectStandardError $err
    # Holding the handle keeps ExitCode readable after the process ends.
    $null = $watch.Handle
    Invoke-Activity -Source $Source
    $watch.WaitForExit()
    Invoke-KStack -PackageDir $package -Arguments @('config', '--disable', 'all') | Out-Null
    Write-Host ('  watch: {0}' -f ((Get-Content -LiteralPath $err -Raw) -replace '\s+$', ''))
    if ($watch.ExitCode -ne 0) {
        throw ('kstack.exe watch exited with {0}; see {1}' -f $watch.ExitCode, $err)
    }
    $after = Get-SourceStatus -Source $Source
    Write-Host ('  captured {0} -> {1}, skipped at raised IRQL {2}' -f $before.captured, $after.captured, $after.skipped_irql)
    if ($after.captured -le $before.captured) {
        throw ('source {0} captured nothing while it was watched' -f $Source)
    }
}

# Every step runs inside this try, so that whatever happens (no package, a
# driver that never started, an error outside the steps) the run still ends
# with verifier /query and its "N passed, N failed" line.
try {
    $package = Resolve-KStackPackage -PackageDir $PackageDir -ScriptRoot $PSScriptRoot

    Step 'the kstack service is installed' {
        if (-not (Get-KStackDriver)) {
            throw (Get-ScErrorExplanation -Code 1060)
        }
    }

    Step 'kstack starts' {
        Invoke-Sc -Arguments @('start', 'kstack') -Allow @(1056) | Out-Null
        Wait-KStackState -State Running
    }

    Step 'Driver Verifier watches kstack.sys' {
        $query = Invoke-Verifier -Arguments @('/query')
        if ($query -notmatch 'kstack\.sys') {
            throw 'verifier /query does not list kstack.sys: run -Phase enable and reboot first.'
        }
    }

    Step 'status (text and JSON)' {
        Write-Host (Invoke-KStack -PackageDir $package -Arguments @('status')).Output
        $status = Get-KStackStatus -PackageDir $package
        if ($status.ring.capacity_bytes -le 0 -or $status.ring.shards -le 0) {
            throw ('the ring reports {0} bytes in {1} shards' -f $status.ring.capacity_bytes, $status.ring.shards)
        }
    }

    Step 'selftest captures a stack inside kstack.sys' {
        Write-Host (Invoke-KStack -PackageDir $package -Arguments @('selftest')).Output
    }

    foreach ($source in @('process', 'thread', 'image', 'registry', 'object', 'ondemand')) {
        Step ('watch {0}' -f $source) { Test-Source -Source $source }
    }

    # The driver, not the registry, says whether DisablePagingExecutive=1 is in
    # effect: a value written since this boot is not (docs/real-kernel.md).
    Step 'timer: watched when DisablePagingExecutive=1 is in effect, else refused (0xE0B50001)' {
        $paging = (Get-KStackStatus -PackageDir $package).paging_executive
        Write-Host ('  DisablePagingExecutive: configured {0}, in effect {1} ({2})' -f $paging.configured, $paging.in_effect, $paging.decided_by)
        if ($paging.in_effect) {
            Test-Source -Source 'timer' -Extra @('--timer-period', '10')
        } else {
            $refusal = Invoke-KStack -PackageDir $package -Arguments @('config', '--enable', 'timer') -Expect @(5)
            if ($refusal.Errors -notmatch 'DisablePagingExecutive') {
                throw ('the refusal does not explain the fix: {0}' -f $refusal.Text)
            }
            Write-Host '  (set DisablePagingExecutive=1 with paging-executive.ps1 -Enable -Restart to sample the timer too)'
        }
    }

    Step 'configuration changes and refusals' {
        Invoke-KStack -PackageDir $package -Arguments @('config', '--frames', '16', '--skip', '1', '--pid', "$PID") | Out-Null
        $config = (Get-KStackStatus -PackageDir $package).config
        if ($config.frames_to_capture -ne 16 -or $config.frames_to_skip -ne 1 -or @($config.processes.include).Count -ne 1 -or $config.processes.include[0] -ne $PID) {
            throw ('the driver reports {0}' -f ($config | ConvertTo-Json -Compress))
        }
        Invoke-KStack -PackageDir $package -Arguments @('config', '--frames', '63') -Expect @(2) | Out-Null
        Invoke-KStack -PackageDir $package -Arguments @('config', '--timer-period', '0') -Expect @(2) | Out-Null
        Invoke-KStack -PackageDir $package -Arguments @('config', '--pid', '4', '--exclude-pid', '4') -Expect @(2) | Out-Null
        Invoke-KStack -PackageDir $package -Arguments @('config', '--sample', 'ondemand=2') -Expect @(2) | Out-Null
        Invoke-KStack -PackageDir $package -Arguments @('config', '--frames', '32', '--skip', '0', '--pid', 'all') | Out-Null
    }

    # Module records (image loads, process exits) enter the ring whatever the
    # sources' settings: every kstack.exe run adds its own, so the ring is never
    # empty after a clear. What clear must leave is no trace record, and read
    # prints only trace records (module records only name frames).
    Step 'read and clear' {
        Invoke-KStack -PackageDir $package -Arguments @('config', '--disable', 'all') | Out-Null
        Invoke-KStack -PackageDir $package -Arguments @('config', '--enable', 'ondemand') | Out-Null
        Invoke-KStack -PackageDir $package -Arguments @('selftest') | Out-Null
        $read = @(Get-KStackRecords)
        if (@($read | Where-Object { $_.source -eq 'ondemand' }).Count -eq 0) {
            throw ('read --json returned {0} records, none of them the selftest''s (source ondemand)' -f $read.Count)
        }
        # A record left for clear to discard; then no source may add one.
        Invoke-KStack -PackageDir $package -Arguments @('selftest') | Out-Null
        Invoke-KStack -PackageDir $package -Arguments @('config', '--disable', 'all') | Out-Null
        $before = Get-KStackStatus -PackageDir $package
        Invoke-KStack -PackageDir $package -Arguments @('clear') | Out-Null
        $after = Get-KStackStatus -PackageDir $package
        Write-Host ('  cleared {0} -> {1}; ring.used {2} after clear (module records: {3} since load)' -f $before.cleared, $after.cleared, $after.ring.used, $after.module_records)
        if ($after.cleared -le $before.cleared) {
            throw ('clear discarded nothing (cleared stayed {0}), though the selftest''s record was waiting' -f $after.cleared)
        }
        $left = @(Get-KStackRecords)
        if ($left.Count -ne 0) {
            throw ('{0} trace records left in the ring after clear (sources {1})' -f $left.Count, ((@($left | ForEach-Object { $_.source }) | Sort-Object -Unique) -join ', '))
        }
    }

    Step ('{0} unload/reload cycles with sources enabled' -f $Cycles) {
        for ($cycle = 1; $cycle -le $Cycles; $cycle++) {
            Invoke-KStack -PackageDir $package -Arguments @('config', '--enable', 'process,thread,image,ondemand') | Out-Null
            Invoke-Activity -Source 'process'
            Stop-KStackDriver | Out-Null
            $left = Get-KStackParameter -Name 'LastUnloadPoolAllocations'
            if ($null -eq $left -or $left -ne 0) {
                throw ('cycle {0}: LastUnloadPoolAllocations is {1}, not 0' -f $cycle, $(if ($null -eq $left) { 'missing' } else { $left }))
            }
            Invoke-Sc -Arguments @('start', 'kstack') | Out-Null
            Wait-KStackState -State Running
            Invoke-KStack -PackageDir $package -Arguments @('status') | Out-Null
        }
    }
} catch {
    # Only an error outside the steps gets here (Step catches its own).
    $script:failed++
    Write-Host ('FAIL outside the steps: {0}' -f $_.Exception.Message)
} finally {
    Write-Host ''
    Write-Host '== verifier /query'
    try {
        Write-Host (Invoke-Verifier -Arguments @('/query'))
    } catch {
        Write-Host ('verifier /query failed: {0}' -f $_.Exception.Message)
    }
    Write-Host ''
    Write-Host ('Transcript: {0}' -f $log)
    Write-Host ('{0} passed, {1} failed' -f $script:passed, $script:failed)
    Stop-Transcript | Out-Null
}
if ($script:failed -gt 0) {
    exit 1
}
exit 0
